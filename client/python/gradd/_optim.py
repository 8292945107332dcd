"""gradd.torch.OptimizerWrapper: the rank restart pattern inside the optimizer.

The pattern of torchft's OptimizerWrapper (an optimizer that asks the
fault-tolerance layer whether to commit before it steps), written for
gradd's rank restart (gradd/_restart.py). Besides the DDP import, a loop
changes one line, its header (``ddp.steps`` wraps the optimizer in place,
``wrap_in_place`` below)::

    from gradd.torch import DistributedDataParallel as DDP   # was torch's
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in ddp.steps(opt, total_steps):                 # was range(total_steps)
        opt.zero_grad()
        loss_fn(ddp(batch_x(step)), batch_y(step)).backward()
        opt.step()

or, with the wrapper in the open:

    ddp = gradd.torch.DistributedDataParallel(model)
    opt = gradd.torch.OptimizerWrapper(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    for step in opt.steps(total_steps):       # the job's step, retried when aborted
        opt.zero_grad()
        loss_fn(ddp(batch_x(step)), batch_y(step)).backward()
        opt.step()

What the wrapper does:

* registers the optimizer's state and its own step counter for the state
  sync, so a restarted rank takes both from the others;
* makes an iteration aborted by a rank restart (or a node lost or admitted)
  end ``backward()`` normally instead of raising
  ``gradd.IterationAbortedError``; ``step()`` then skips the optimizer step
  (``ddp.should_commit()`` is False) and the step counter stays where it was;
* ``zero_grad()`` runs the state sync when one is due;
* ``steps(n)`` yields the job's next step until ``n`` steps are committed:
  an aborted step comes again, and a restarted rank starts at the step the
  job is at (the counter arrives with the sync). ``step_count`` is the same
  number for loops that count on their own.

What a loop must still do itself:

* take its step (or its position in the data) from the wrapper
  (``steps(n)`` or ``step_count``), not from a counter of its own, and draw
  the batch of a step the same way every time it is drawn: a data loader
  that can start at a given step and give a step's batch again (a sampler
  seeded by the step, an index computed from it). With that, a run with a
  restarted rank ends with the same parameters, bit for bit, as a run
  without one;
* register any other state that changes with the steps and that a
  restarted rank needs (an LR scheduler's ``state_dict`` /
  ``load_state_dict``, an EMA of the weights, an RNG's state) with
  ``ddp.register_state``, in the same order on every rank, and step such
  state only when ``step()`` returned having committed (``opt.committed``);
* keep checkpoints for what rank restart does not cover: the whole job
  failing (every rank gone, a rank not back within the grace, the rendezvous
  coordinator lost);
* not use a torch process group for the gradients' sake (a restarted
  process cannot become a member of one again; gradd.torch needs none).
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch


class OptimizerWrapper(torch.optim.Optimizer):
    """Wraps `optimizer` for rank restarts of the job of `ddp` (a
    gradd.torch.DistributedDataParallel); see the module doc. Everything
    else is the wrapped optimizer's (``param_groups``, ``state``, any other
    attribute)."""

    def __init__(self, ddp, optimizer: torch.optim.Optimizer):
        # Not Optimizer.__init__: the wrapped optimizer owns the parameter
        # groups and the state; this class only passes isinstance checks.
        from gradd.torch import DistributedDataParallel

        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError(
                "OptimizerWrapper(ddp, optimizer): ddp must be a "
                f"gradd.torch.DistributedDataParallel, got {type(ddp).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "OptimizerWrapper(ddp, optimizer): optimizer must be a torch.optim.Optimizer, "
                f"got {type(optimizer).__name__}")
        self.__dict__["optimizer"] = optimizer
        self.__dict__["ddp"] = ddp
        # The optimizer's own methods as they are now: wrap_in_place then
        # puts this wrapper's in their place on the optimizer object.
        self.__dict__["_inner_step"] = optimizer.step
        self.__dict__["_inner_zero_grad"] = optimizer.zero_grad
        self.__dict__["_steps"] = 0
        self.__dict__["skipped"] = 0
        self.__dict__["committed"] = False
        ddp.register_state(optimizer.state_dict, optimizer.load_state_dict)
        ddp.register_state(self._counter_state, self._load_counter_state)
        ddp._abort_iterations_quietly()

    # The wrapped optimizer's attributes, read and written through.
    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    def __setattr__(self, name, value):
        if name in ("param_groups", "state", "defaults"):
            setattr(self.__dict__["optimizer"], name, value)
        elif name in self.__dict__ or hasattr(type(self), name):
            # Ours, or a method patched on this object (an LR scheduler
            # wraps optimizer.step): stays on the wrapper.
            self.__dict__[name] = value
        else:
            setattr(self.__dict__["optimizer"], name, value)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def __repr__(self) -> str:
        return f"OptimizerWrapper({self.optimizer!r}, step_count={self._steps})"

    # -------------------------------------------------------------- the loop
    @property
    def step_count(self) -> int:
        """Steps committed by the job so far (the next step's number, from
        0); a restarted rank has the job's count after its state sync."""
        return self._steps

    def steps(self, total: int) -> Iterator[int]:
        """Yields the job's next step until `total` are committed: after an
        aborted iteration the same step again; on a restarted rank the step
        the job is at. Runs the state sync (when due) before each."""
        while True:
            self.ddp.sync_state()
            if self._steps >= total:
                return
            yield self._steps

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """The state sync when one is due (a restarted rank takes the job's
        parameters, optimizer state and step here), then the optimizer's
        zero_grad."""
        self.ddp.sync_state()
        if set_to_none is None:
            self._inner_zero_grad()
        else:
            self._inner_zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """The optimizer's step, unless the iteration was aborted (a rank
        restarted or the job's network re-formed): then nothing is applied,
        ``committed`` is False and the step count stays, so the loop
        retries the batch. Returns the optimizer's result, None when
        skipped."""
        if not self.ddp.should_commit():
            self.skipped += 1
            self.committed = False
            return None
        out = self._inner_step() if closure is None else self._inner_step(closure)
        self._steps += 1
        self.committed = True
        return out

    # ---------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step_count": self._steps}

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._steps = int(state_dict["step_count"])

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    # The state sync's view of the counter (gradd/_restart.py).
    def _counter_state(self) -> dict:
        return {"step_count": self._steps}

    def _load_counter_state(self, state: dict) -> None:
        self._steps = int(state["step_count"])


def wrap_in_place(ddp, optimizer) -> OptimizerWrapper:
    """The OptimizerWrapper of `optimizer` for `ddp`, made once: from then on
    the optimizer object's own ``step()`` and ``zero_grad()`` are the
    wrapper's (instance attributes over the class's methods, as torch's LR
    schedulers patch ``step``), so a loop keeps calling ``opt.step()``.
    An OptimizerWrapper is returned as it is."""
    if isinstance(optimizer, OptimizerWrapper):
        return optimizer
    wrapper = optimizer.__dict__.get("_gradd_wrapper")
    if wrapper is not None:
        if wrapper.ddp is not ddp:
            raise ValueError("this optimizer already steps for another "
                             "gradd.torch.DistributedDataParallel")
        return wrapper
    wrapper = OptimizerWrapper(ddp, optimizer)
    optimizer.__dict__["_gradd_wrapper"] = wrapper
    optimizer.step = wrapper.step
    optimizer.zero_grad = wrapper.zero_grad
    return wrapper
