"""python3 -m gradd.run: the same as `gradd run`."""
import sys

from gradd.run import main

sys.exit(main())
