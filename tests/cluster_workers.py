"""What torchrun runs in the cluster-fault tests (tests/distributed/test_cluster_faults.py):
``contrastkit``'s command line, with at most one fault armed.

``CONTRASTKIT_TEST_FAULT`` holds ``{"rank": R, "attempt": A, "backward": N, "action": X}``: the
process of global rank ``R`` in the ``A``-th start of the group (``TORCHELASTIC_RESTART_COUNT``)
acts at its ``N``-th backward pass (the ``N``-th training step it runs): ``"SIGKILL"`` kills
itself (a rank that dies); ``"SIGTERM"`` / ``"SIGUSR1"`` sends the signal to its torchrun agent
(a scheduler preempting the job), which passes it on to every rank of its node.
"""

import json
import os
import signal
import sys

import torch


def _arm(fault: dict) -> None:
    real, calls = torch.Tensor.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == fault["backward"]:
            if fault["action"] == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            os.kill(os.getppid(), getattr(signal, fault["action"]))  # the agent started this process
        return real(self, *args, **kwargs)

    torch.Tensor.backward = backward


if __name__ == "__main__":
    fault = json.loads(os.environ.get("CONTRASTKIT_TEST_FAULT") or "null")
    if fault and int(os.environ.get("RANK", "0")) == fault["rank"] \
            and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == fault.get("attempt", 0):
        _arm(fault)
    from contrastkit.cli import main

    sys.exit(main(sys.argv[1:]))
