"""A trainer process for the metrics and stall tests: two local ranks of one
job as threads (gradd._C releases the GIL while it blocks).

  metrics_worker.py run SOCKET JOB ITERATIONS
      runs ITERATIONS iterations, prints READY, keeps the job attached until
      a line arrives on stdin, then detaches and prints DONE.
  metrics_worker.py stall SOCKET JOB [NODE_RANK NUM_NODES COORDINATOR WITHHOLD]
      (multi-node: this process is node NODE_RANK's two ranks; WITHHOLD 0:
      both ranks hand everything over and wait)
      one full iteration, then local rank 1 hands over every bucket but the
      one holding parameter "b" and is stuck until rank 0's wait_all has
      ended; prints, as JSON, what each rank raised (rank 1: nothing).
"""
import json
import sys
import threading

import numpy as np

import gradd

PARAMS = [("a", (1000,), "float32"), ("b", (1000,), "float32"), ("c", (1000,), "float32")]


def attach(socket, job, rank, **nodes):
    # 4000-byte parameters over 3 KiB bucket caps: one bucket per parameter.
    return gradd.attach(PARAMS, socket=socket, job_id=job, local_rank=rank, local_world_size=2,
                        bucket_cap_mb=0.003, first_bucket_cap_mb=0.003, wait_timeout=60.0,
                        **nodes)


def iteration(c, rank, skip=()):
    for i in reversed(range(c.num_params)):
        if PARAMS[i][0] in skip:
            continue
        c.gradient(i)[...] = rank + 1
        c.mark_ready(i)
    c.wait_all()


def run_ranks(fn):
    results, errors = [None, None], [None, None]

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # reported to the test
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def main():
    mode, socket, job = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "run":
        iterations = int(sys.argv[4])
        clients = [None, None]
        barrier = threading.Barrier(2)

        def attach_and_run(rank):
            c = attach(socket, job, rank)
            clients[rank] = c
            for _ in range(iterations):
                iteration(c, rank)
            np.testing.assert_allclose(c.gradient(0), 1.5)
            barrier.wait()

        _, errors = run_ranks(attach_and_run)
        if any(errors):
            raise SystemExit(f"ranks failed: {errors}")
        print("READY", flush=True)
        sys.stdin.readline()
        for c in clients:
            c.detach()
        print("DONE", flush=True)
        return
    if mode == "stall":
        released = threading.Event()
        nodes, withhold = {}, True
        if len(sys.argv) > 4:
            nodes = dict(node_rank=int(sys.argv[4]), num_nodes=int(sys.argv[5]),
                         coordinator=sys.argv[6])
            withhold = sys.argv[7] == "1"

        def stall(rank):
            c = attach(socket, job, rank, **nodes)
            iteration(c, rank)
            if rank == 0 or not withhold:
                try:
                    iteration(c, rank)
                finally:
                    released.set()
                return
            # Rank 1 hands over "a" and "c", then is stuck (as if in its
            # forward pass) until rank 0's wait has ended.
            for i in reversed(range(c.num_params)):
                if PARAMS[i][0] != "b":
                    c.gradient(i)[...] = 2
                    c.mark_ready(i)
            if not released.wait(timeout=60):
                raise TimeoutError("rank 0 never came back")

        _, errors = run_ranks(stall)
        print(json.dumps([None if e is None else f"{type(e).__name__}: {e}" for e in errors]),
              flush=True)
        return
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
