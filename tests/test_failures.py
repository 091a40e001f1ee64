"""What a failed training step means for the job: which failures retry
without their node(s), which never retry, and the ledger's arithmetic."""

from __future__ import annotations

import json
import signal

from hpcyolo.node.job import end, node_failure, task_failure
from hpcyolo_trainer.common.ledger import account, read_starts
from hpcyolo_trainer.common.preemption import DEVICE_FAULT_EXIT_CODE, PEER_LOST_EXIT_CODE
from hpcyolo_trainer.common.preemption import HANG_EXIT_CODE

KILLED = "srun: error: node2: tasks 2-3: Killed\nsrun: error: node1: tasks 0-1: Exited with exit code 76\n"


def test_a_rank_killed_by_a_signal_is_a_node_failure():
    failure = node_failure(137, KILLED)
    assert failure.nodes == ("node2",) and failure.ranks == "2-3" and "Killed" in failure.reason
    assert node_failure(1, "srun: error: node1: task 0: Segmentation fault\n").nodes == ("node1",)
    assert node_failure(1, "srun: error: Node failure on node3\n").nodes == ("node3",)


def test_a_rank_whose_device_or_network_failed_is_its_nodes_failure():
    stderr = ("srun: error: node2: task 3: Exited with exit code 78\n"
              "srun: error: node1: tasks 0-1: Exited with exit code 76\n")
    failure = node_failure(DEVICE_FAULT_EXIT_CODE, stderr)
    assert failure.nodes == ("node2",) and failure.ranks == "3" and "device or network failed" in failure.reason


def test_the_errors_of_a_failing_gpu_or_link_are_told_from_the_users():
    import torch
    import torch.distributed as dist

    from hpcyolo_trainer.parallel.dist import device_fault_line, lost_peer_line

    ecc = RuntimeError("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be ...")
    nccl = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:2062, unhandled system error")
    assert "ECC" in device_fault_line(ecc) and "unhandled system error" in device_fault_line(nccl)
    # As torch 2.8+ raises them: C10_CUDA_CHECK's AcceleratorError with the runtime's code, and ProcessGroupNCCL's
    # C10D_NCCL_CHECK ("NCCL error in: FILE:LINE, " + ncclGetErrorString + ", NCCL version ...\n" + the detail)
    hint = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
    for code, words in [(214, "uncorrectable ECC error encountered"), (719, "unspecified launch failure"),
                        (999, "unknown error")]:
        e = torch.AcceleratorError(f"CUDA error: {words}{hint}")
        e.error_code = code
        assert f"AcceleratorError {code}" in device_fault_line(e), code
    for code, words in [(700, "an illegal memory access was encountered"), (209, "no kernel image is available "
                                                                                  "for execution on the device")]:
        e = torch.AcceleratorError(f"CUDA error: {words}{hint}")
        e.error_code = code  # the code's bug or the build's, not the node's
        assert device_fault_line(e) is None, code
    version = ", NCCL version 2.27.3"
    system = dist.DistBackendError(
        f"NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, unhandled system error "
        f"(run with NCCL_DEBUG=INFO for details){version}\nncclSystemError: System call (e.g. socket, malloc) or "
        "external library call failed or device error. \nLast error:\nsocketProgress: Connection closed by remote peer")
    cuda = dist.DistBackendError(
        f"NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
        f"NCCL_DEBUG=INFO for details){version}\nncclUnhandledCudaError: Call to CUDA function failed.")
    usage = dist.DistBackendError(
        f"NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, invalid usage (run with "
        f"NCCL_DEBUG=WARN for details){version}\nncclInvalidUsage: This usually reflects invalid usage of NCCL "
        "library.")
    assert device_fault_line(system) and device_fault_line(cuda) and device_fault_line(usage) is None
    assert device_fault_line(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) is None
    assert device_fault_line(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    # a peer gone is not this rank's device: the rank that failed first is named instead
    gone = dist.DistBackendError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
    assert device_fault_line(gone) is None and lost_peer_line(gone) is not None


def test_a_submitit_task_sees_its_own_ranks_failure_and_one_task_decides():
    assert task_failure(-signal.SIGKILL, 3, "node2").nodes == ("node2",)
    assert "Killed" in task_failure(-signal.SIGKILL, 3, "node2").reason
    assert task_failure(DEVICE_FAULT_EXIT_CODE, 1, "node1").ranks == "1"
    for users in (1, 2, PEER_LOST_EXIT_CODE, -signal.SIGTERM, 0):
        assert task_failure(users, 0, "node1") is None
    assert task_failure(HANG_EXIT_CODE, 0, "node1", {"ranks": [3], "nodes": ["node2"], "reason": "x"}).nodes == \
        ("node2",)


def test_a_users_error_never_retries():
    assert node_failure(1, "srun: error: node1: tasks 0-1: Exited with exit code 1\n") is None
    assert node_failure(2, "srun: error: node1: task 0: Exited with exit code 2\n") is None
    assert node_failure(137, "slurmstepd: error: Detected 1 oom_kill event in StepId=5.0\n" + KILLED) is None
    assert node_failure(HANG_EXIT_CODE, "", {"ranks": [], "nodes": [], "reason": "every rank alike"}) is None


def test_a_hang_blamed_on_a_node_retries_without_it():
    blame = {"ranks": [3], "nodes": ["node2"], "reason": "did not answer"}
    failure = node_failure(HANG_EXIT_CODE, "srun: error: node1: tasks 0-2: Exited with exit code 79\n", blame)
    assert failure.nodes == ("node2",) and failure.reason.startswith("hang:")


def test_failures_retry_up_to_max_failures_then_stop():
    failure = node_failure(137, KILLED)
    first = end(137, None, job="7", restart=0, max_requeues=3, failure=failure, failures_before=0, max_failures=1)
    assert first.requeue and first.exclude == ("node2",) and first.code == 0
    again = end(137, None, job="7", restart=1, max_requeues=3, failure=failure, failures_before=1, max_failures=1)
    assert not again.requeue and again.code == 137 and "max_failures is 1 and was reached" in again.message
    never = end(137, None, job="7", restart=0, max_requeues=3, failure=failure, failures_before=0, max_failures=0)
    assert not never.requeue and never.code == 137


def write_start(folder, name, stamps, trainer=None):
    (folder / f"{name}.times").write_text("".join(f"{k} {v}\n" for k, v in stamps.items()))
    if trainer:
        (folder / f"{name}.json").write_text(json.dumps(trainer))


def test_the_ledger_tiles_each_start_and_moves_recomputed_steps_to_lost(tmp_path):
    write_start(tmp_path, "5-0", {"submit": 90, "start": 100, "begin": 100.5, "stage": 102, "train": 110,
                                  "end": 150, "exit": 151},
                {"times": {"process": 111, "rendezvous": 113, "setup": 114, "loop": 120, "exit": 149},
                 "seconds": {"validation": 5, "checkpoint": 2}, "updated": 149,
                 "steps": {"resumed": 0, "reached": 100, "checkpoint": 80}})
    write_start(tmp_path, "5-1", {"begin": 171, "train": 172, "end": 200, "exit": 200.5},
                {"times": {"process": 172.5, "rendezvous": 174, "setup": 175, "loop": 176, "finish": 198,
                           "exit": 199}, "seconds": {"validation": 4, "checkpoint": 0}, "updated": 199,
                 "steps": {"resumed": 80, "reached": 150, "checkpoint": 150}})
    figures = account(read_starts(tmp_path))
    parts = figures["parts"]
    assert figures["wall"] == 151 - 100.5 + 200.5 - 171
    assert abs(figures["booked"] - figures["wall"]) < 1e-9  # the parts tile the jobs' time
    assert parts["queued"] == 10 and parts["idle"] == 20
    assert parts["staging"] == 8 and parts["startup"] == 2 + 1.5 and parts["rendezvous"] == 1 + 1
    # the first start's loop: 29 s, 7 of them validation and checkpoint; 20 of its 100 steps done again
    assert abs(parts["lost"] - 22 * 20 / 100) < 1e-9
    assert abs(parts["training"] - (22 - 4.4 + 22 - 4)) < 1e-9
    assert parts["finish"] == 1 and parts["launch"] == 1 + 1 + 0.5 + 1


def test_a_failed_node_is_left_out_in_the_allocation_where_the_rest_can_train():
    from hpcyolo.node.job import Failure, in_place

    lost = Failure(("n2",), "2,3", "rank 2 on n2: Killed")
    # a node to spare: as many nodes as before
    assert in_place(lost, ["n1", "n2", "n3"], [], 2, 2, 8) == (["n2"], 2)
    # none to spare: the nodes left, where the global batch splits over their ranks
    assert in_place(lost, ["n1", "n2"], [], 2, 2, 8) == (["n2"], 1)
    assert in_place(lost, ["n1", "n2", "n3"], [], 3, 2, 8) == (["n2"], 2)
    assert in_place(lost, ["n1", "n2", "n3"], [], 3, 3, 8) is None  # 8 images over 6 ranks: requeue instead
    # nodes left out before stay out; a job with nothing left is requeued
    assert in_place(lost, ["n1", "n2", "n3"], ["n3"], 3, 2, 8) == (["n3", "n2"], 1)
    assert in_place(Failure(("n1",), "0", "x"), ["n1", "n2"], ["n2"], 2, 2, 8) is None
