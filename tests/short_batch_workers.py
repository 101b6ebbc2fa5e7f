"""One rank of a 2-process pretraining run on an unlabeled collection, started by
``tests/distributed/test_short_batches.py``: ``python short_batch_workers.py RANK WORLD INIT
DATA OUT RESULT``. The rank joins a gloo group through the file ``INIT`` with a short
collective time-out (a rank left waiting by the others raises instead of blocking), trains
with ``--bad-files skip`` and writes to ``RESULT`` the steps each epoch ended at on this rank
and its summary (rank 0's; ``None`` on the others)."""

import datetime
import json
import sys

import torch
import torch._dynamo  # noqa: F401  (before the group exists: see contrastkit.train.parallel)
import torch.distributed as dist


def main() -> None:
    rank, world, init, data, out, result = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:7]
    torch.set_num_threads(1)
    # Each collective may wait while the other rank sets up or evaluates, slower on a loaded machine;
    # a real hang still fails the test at its own guard (test_short_batches.py).
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))

    from contrastkit.train import PretrainConfig, loop, pretrain  # noqa: E402

    ended_at = []
    real_end_epoch = loop._end_epoch

    def end_epoch(run, *args, **kwargs):
        ended_at.append(run.state.step)
        return real_end_epoch(run, *args, **kwargs)

    loop._end_epoch = end_epoch
    try:
        summary = pretrain(PretrainConfig(data=data, method="moco", epochs=1, batch_size=8, out=out, device="cpu",
                                          log_every=1, eval_every=0, seed=0), progress=False, baselines=False)
        with open(result, "w", encoding="utf-8") as handle:
            json.dump({"ended_at": ended_at, "summary": summary}, handle)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # not on import: pytest collects this file for its doctests
    main()
