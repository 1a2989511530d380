from gpuwarden.act.killer import KillBudget
from gpuwarden.model import Event, Severity
from gpuwarden.policy import EngineView, kills

A = EngineView("a", frozenset({"0000:03:00.0"}), "kill", "kill")
B = EngineView("b", frozenset({"0000:83:00.0"}), "alert", "kill")
ANY = EngineView("any", None, "kill", "alert")


def ev(kind, gpu=None, engine=None, severity=Severity.WARNING):
    return Event(kind, severity, kind, 0.0, gpu=gpu, engine=engine)


def test_a_stall_kills_only_its_engine_and_only_when_configured_to():
    assert kills(ev("engine_stall", engine="a"), [A, B, ANY]) == [("a", "stalled")]
    assert kills(ev("engine_stall", engine="b"), [A, B, ANY]) == []


def test_a_gpu_fault_kills_the_engines_on_that_gpu():
    assert kills(ev("sq_intr", gpu="0000:03:00.0"), [A, B]) == [("a", "kernel reported sq_intr on 0000:03:00.0")]
    assert kills(ev("page_fault", gpu="0000:83:00.0"), [A, B]) == [("b", "kernel reported page_fault on 0000:83:00.0")]


def test_unknown_gpus_and_faults_without_a_gpu_match_everything():
    both = EngineView("u", None, "kill", "kill")
    assert kills(ev("ring_timeout", gpu="0000:03:00.0"), [both]) == [
        ("u", "kernel reported ring_timeout on 0000:03:00.0")]
    assert [n for n, _ in kills(ev("sq_intr"), [A, B, both])] == ["a", "b", "u"]


def test_only_critical_xids_and_fault_kinds_count():
    assert kills(ev("xid", gpu="0000:03:00.0", severity=Severity.CRITICAL), [A]) == [
        ("a", "kernel reported xid on 0000:03:00.0")]
    assert kills(ev("xid", gpu="0000:03:00.0", severity=Severity.WARNING), [A]) == []
    assert kills(ev("pcie_aer", gpu="0000:03:00.0", severity=Severity.CRITICAL), [A]) == []


def test_kill_budget():
    budget = KillBudget(limit=2, window=100)
    for t in (0, 10):
        assert budget.allow(t)
        budget.spend(t)
    assert not budget.allow(50)
    assert budget.allow(101)  # the first kill left the window
