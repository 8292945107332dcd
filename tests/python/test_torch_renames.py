"""Renamed user-facing names of gradd.torch (docs/deprecations.md) and the
shape of its private modules (issue 35): the old names keep working for one
release with a FutureWarning; the private modules are objects the DDP
builds, none reaching into the DDP's attributes. No daemon: the attach is
captured."""
import pathlib
import pickle
import re
import warnings

import pytest

import gradd.torch as gt
from gradd import _ddp_logging
from test_torch_introspection import TwoLin, one_rank  # noqa: F401 (fixture)

PACKAGE = pathlib.Path(gt.__file__).resolve().parent


def _ddp(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn about nothing
        return gt.DistributedDataParallel(TwoLin(), job_id="renames", **kwargs)


def test_node_loss_divide_reaches_the_client_under_its_new_name(one_rank):
    _ddp()
    assert one_rank["client"].kwargs["divide_by_initial_world_size"] is False
    ddp = _ddp(divide_by_initial_world_after_reformation=True)
    # The client library's option keeps its C++ name (client.h).
    assert one_rank["client"].kwargs["divide_by_initial_world_size"] is True
    assert ddp._attach_options["divide_by_initial_world_after_reformation"] is True


@pytest.mark.parametrize("value", [True, False])
def test_old_divide_keyword_warns_and_still_works(one_rank, value):
    with pytest.warns(FutureWarning) as got:
        ddp = gt.DistributedDataParallel(TwoLin(), job_id="renames",
                                         divide_by_initial_world_size=value)
    messages = [str(w.message) for w in got if w.category is FutureWarning]
    assert len(messages) == 1, messages
    assert "(divide_by_initial_world_size=...) is deprecated" in messages[0]
    assert "divide_by_initial_world_after_reformation" in messages[0]
    # Attributed to the caller, not to gradd's own frames.
    assert got[0].filename == __file__
    assert one_rank["client"].kwargs["divide_by_initial_world_size"] is value
    assert ddp._attach_options["divide_by_initial_world_after_reformation"] is value


def test_old_and_new_divide_keyword_together_is_an_error(one_rank):
    with pytest.raises(TypeError, match="got both divide_by_initial_world_after_reformation"):
        gt.DistributedDataParallel(TwoLin(), job_id="renames",
                                   divide_by_initial_world_after_reformation=True,
                                   divide_by_initial_world_size=True)


def test_join_keeps_torchs_divide_name_and_attribute(one_rank):
    """join()'s divide_by_initial_world_size is torch's (uneven inputs): no
    warning, and the join hook sets torch's DDP attribute, apart from the
    node-loss option."""
    ddp = _ddp(divide_by_initial_world_after_reformation=True)
    assert ddp._divide_by_initial_world_size is True  # torch's default
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddp.join(divide_by_initial_world_size=False, enable=False)
    assert ddp._divide_by_initial_world_size is False
    assert ddp._attach_options["divide_by_initial_world_after_reformation"] is True
    assert not ddp._join_config.enable  # torch's Join sets and reads it on the DDP


def test_a_ddp_pickled_by_the_previous_release_loads(one_rank):
    """The previous release pickled its logging state and the node-loss
    divide under their old attribute names."""
    ddp = _ddp(divide_by_initial_world_after_reformation=True)
    ddp._set_ddp_runtime_logging_sample_rate(7)
    old = pickle.loads(pickle.dumps(ddp.__getstate__()))
    log = old.pop("_logging")
    old.update(_logging_sample_rate=log.sample_rate, _sampled_stats=None, _logged_error="x")
    opts = old["_attach_options"]
    opts["divide_by_initial_world_size"] = opts.pop("divide_by_initial_world_after_reformation")
    loaded = gt.DistributedDataParallel.__new__(gt.DistributedDataParallel)
    loaded.__setstate__(old)
    data = loaded._get_ddp_logging_data()
    assert data["gradd_runtime_logging_sample_rate"] == 7
    assert "has_error" not in data  # as for any unpickled copy
    assert loaded._attach_options["divide_by_initial_world_after_reformation"] is True
    assert "divide_by_initial_world_size" not in loaded._attach_options
    for key in ("_logging_sample_rate", "_sampled_stats", "_logged_error"):
        assert key not in loaded.__dict__


def test_logging_state_lives_in_its_own_object(one_rank):
    """_get_ddp_logging_data()'s state is a RuntimeLog the DDP owns; a
    logged error and the sample rate survive as torch's logger keeps them."""
    ddp = _ddp()
    assert isinstance(ddp._logging, _ddp_logging.RuntimeLog)
    assert ddp._logging.params == list(ddp.module.parameters())
    ddp._reducer.iterations_done = 1  # as if an iteration had run
    with pytest.raises(RuntimeError, match="should be called before training loop starts"):
        ddp._set_static_graph()
    assert "set_static_graph() should be called" in ddp._get_ddp_logging_data()["error"]


def test_private_modules_do_not_reach_into_the_ddp():
    """Each private module gets what it needs from the DDP (constructor
    arguments, callbacks): none reads or writes ``ddp._x`` or the DDP's
    ``__dict__``. The one call left is OptimizerWrapper's (a public class
    that takes the user's DDP) switch to quiet aborts."""
    allowed = {"abort_iterations_quietly"}
    found = {}
    for path in sorted(PACKAGE.glob("_*.py")):
        text = path.read_text()
        names = set(re.findall(r"\bddp\._([a-z_]+)", text)) - allowed
        if names or "ddp.__dict__" in text:
            found[path.name] = sorted(names) or ["__dict__"]
    assert not found, found


def test_no_python_source_over_800_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert not {n: s for n, s in sizes.items() if s > 800}, sizes


def test_rank_restart_state_is_its_own_object(one_rank, monkeypatch):
    """Rank restart's state (gradd/_restart.py) is a RankRestart built at
    attach with the client; the DDP's public properties read it."""
    ddp = _ddp()
    restart = ddp._restart
    assert ddp.restarted is False and ddp.restart_iteration is None
    assert ddp.rank_restart_grace_ms == 0 and ddp.min_nodes == 0
    restart.on_aborted()
    assert not ddp.should_commit()
    restart.on_backward_done()
    assert ddp.should_commit()
    ddp.register_state(lambda: {}, lambda s: None)
    assert len(restart.states) == 1
    with pytest.raises(TypeError, match="takes two callables"):
        ddp.register_state(1, 2)
    # Nothing to sync on a world of one, and no sync without a grace.
    assert ddp.sync_state() is False
    # The client's answers at attach: a rank that came back.
    monkeypatch.setattr(type(one_rank["client"]), "restarted", True, raising=False)
    monkeypatch.setattr(type(one_rank["client"]), "iteration", 5)
    back = _ddp()
    assert back.restarted is True and back.restart_iteration == 5
    assert back._restart.unsynced  # loads the registered states at its first sync
    # A copy drops the attach's objects and builds them again on attach.
    state = ddp.__getstate__()
    for key in ("_restart", "_rebuild", "_hooks", "_uneven_inputs", "_world", "_client"):
        assert key not in state


@pytest.mark.parametrize("old,new", [("rejoined", "restarted"),
                                     ("rejoin_iteration", "restart_iteration")])
def test_old_restart_property_names_warn_and_still_answer(one_rank, old, new):
    ddp = _ddp()
    with pytest.warns(FutureWarning, match=rf"\.{old} is deprecated .* use \.{new}") as got:
        value = getattr(ddp, old)
    assert got[0].filename == __file__
    assert value == getattr(ddp, new)
    assert getattr(type(ddp), old).__doc__.startswith(f"Deprecated name of ``{new}``")
