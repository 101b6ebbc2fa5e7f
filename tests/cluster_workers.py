"""What torchrun runs in the cluster-fault tests (tests/distributed/test_cluster_faults.py):
``contrastkit``'s command line, with at most one fault armed.

``CONTRASTKIT_TEST_FAULT`` holds ``{"rank": R, "attempt": A, "backward": N, "action": X}``: the
process of global rank ``R`` in the ``A``-th start of the group (``TORCHELASTIC_RESTART_COUNT``)
acts at its ``N``-th backward pass (the ``N``-th training step it runs): ``"SIGKILL"`` kills
itself (a rank that dies); ``"SIGTERM"`` / ``"SIGUSR1"`` sends the signal to its torchrun agent
(a scheduler preempting the job), which passes it on to every rank of its node. With
``"checkpoint": N`` instead of ``"backward"`` it acts when the run starts its ``N``-th checkpoint
(every rank takes part in each; the first, with restarts allowed, comes before the first step:
acting there is a rank dying while the run is set up). ``"leave": NAME`` first writes the file
``NAME`` into the run's ``--out`` (a file of the user's, put there meanwhile).
"""

import json
import os
import signal
import sys
import time

import torch


def _act(fault: dict) -> None:
    if fault.get("leave"):
        out = sys.argv[sys.argv.index("--out") + 1]
        with open(os.path.join(out, fault["leave"]), "w", encoding="utf-8") as handle:
            handle.write("mine\n")
    if fault["action"] == "SIGKILL":
        # Beside the run's folder, what the test reads to know the rank died here (torchrun logs the
        # exit of only one failed rank, by a whole-second time stamp: maybe the other's).
        out = sys.argv[sys.argv.index("--out") + 1]
        with open(f"{out}.died-rank{fault['rank']}-attempt{fault.get('attempt', 0)}", "w", encoding="utf-8"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    number = getattr(signal, fault["action"])
    os.kill(os.getppid(), number)  # the agent started this process
    # The agent passes the signal on to every rank; this rank goes on once it has its own copy, so
    # that the step the ranks stop at does not depend on how fast a loaded machine delivers it.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        handler = getattr(signal.getsignal(number), "__self__", None)  # contrastkit's StopSignals
        if handler is None or getattr(handler, "received", None):
            return
        time.sleep(0.01)


def _arm(fault: dict) -> None:
    if "checkpoint" in fault:
        from contrastkit.train import loop

        real_write, writes = loop._write_checkpoint, [0]

        def write_checkpoint(*args, **kwargs):
            writes[0] += 1
            if writes[0] == fault["checkpoint"]:
                _act(fault)
            return real_write(*args, **kwargs)

        loop._write_checkpoint = write_checkpoint
        return
    real, calls = torch.Tensor.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == fault["backward"]:
            _act(fault)
        return real(self, *args, **kwargs)

    torch.Tensor.backward = backward


if __name__ == "__main__":
    fault = json.loads(os.environ.get("CONTRASTKIT_TEST_FAULT") or "null")
    if fault and int(os.environ.get("RANK", "0")) == fault["rank"] \
            and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == fault.get("attempt", 0):
        _arm(fault)
    from contrastkit.cli import main

    sys.exit(main(sys.argv[1:]))
