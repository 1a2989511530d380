"""A fault's pasid resolved to a process through KFD's sysfs. No Radeon here: the /sys/class/kfd/kfd/proc tree
is written into a temporary folder, as amdkfd/kfd_process.c lays it out (proc/<pid>/pasid)."""

from gpuwarden.engine.kfd import pasids_of
from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.records import KernelRecord


def test_pasids_of_an_engines_processes(tmp_path):
    for pid, pasid in ((100, "32769\n"), (101, "32770\n"), (300, "40000\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "pasid").write_text(pasid)
    assert pasids_of([100, 101, 102], tmp_path) == frozenset({32769, 32770})  # 102 never opened /dev/kfd
    assert pasids_of([102], tmp_path) == frozenset()
    assert pasids_of([100], tmp_path / "absent") is None  # no KFD: nothing can be resolved


def test_a_fault_line_carries_its_pasid_as_evidence():
    line = ("amdgpu 0000:25:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:144 vmid:3 pasid:32769,"
            " for process  pid 0 thread  pid 0)")
    [burst] = Classifier().feed(KernelRecord(line, 1.0), 1.0)
    assert burst.event.evidence["pasid"] == 32769
    assert burst.event.evidence.get("process", {}).get("pid", 0) == 0  # the driver knew no process: the pasid tells
