"""A large batch is augmented in kornia calls of bounded size, so the views of a 16,384-pair
batch (cached-gradient accumulation) do not hold ten float copies of the whole batch at once."""

import os
import subprocess
import sys
import textwrap

import torch

import contrastkit
from contrastkit.data import as_streaming, make_views
from contrastkit.data import views as views_module

SRC = os.path.dirname(os.path.dirname(os.path.abspath(contrastkit.__file__)))


class _Blank(torch.utils.data.Dataset):
    def __init__(self, n, shape):
        self.n, self.shape = n, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(self.shape, dtype=torch.uint8), 0


def test_rows_per_call_follow_the_image_size():
    assert views_module.augment_rows((3, 32, 32)) == 2048
    assert views_module.augment_rows((1, 28, 28)) == 2048 * 3 * 32 * 32 // 784
    assert views_module.augment_rows((3, 224, 224)) == 41
    assert views_module.augment_rows((3, 10_000, 10_000)) == 1  # never zero


def test_a_large_batch_is_augmented_in_bounded_calls(monkeypatch):
    monkeypatch.setattr(views_module, "AUGMENT_CALL_VALUES", 8 * 3 * 16 * 16)  # 8 rows per call
    views = make_views(as_streaming(_Blank(64, (3, 16, 16))))
    calls = []
    augment = views._augment

    def counting(batch):
        calls.append(batch.shape[0])
        return augment(batch)

    views._augment = counting
    torch.manual_seed(0)
    images = torch.randint(0, 256, (20, 3, 16, 16), dtype=torch.uint8)
    view_a, view_b = views.views_of(images)
    assert calls == [8, 8, 8, 8, 8]  # 40 rows: both views of 20 pairs
    assert view_a.shape == view_b.shape == (20, 3, 16, 16)
    assert float(view_a.min()) >= 0.0 and float(view_a.max()) <= 1.0
    # every row is its own augmentation: the two views of a pair differ, chunk boundary or not
    assert all(not torch.equal(view_a[i], view_b[i]) for i in range(20))

    calls.clear()
    views.views_of(images[:4])  # 8 rows: one call, as before the limit existed
    assert calls == [8]


def test_the_views_of_16384_pairs_stay_small():
    # Before the bounded calls this grew the process by about 4.3 GiB (one kornia call on 32,768
    # rows). Measured from the process's size after its imports, which depends on the torch build
    # (a CUDA build's import alone is about 0.8 GiB larger than the CPU build's).
    child = textwrap.dedent("""
        import resource, torch
        torch.set_num_threads(1)
        from contrastkit.data import as_streaming, make_views
        class Blank(torch.utils.data.Dataset):
            def __len__(self): return 16384
            def __getitem__(self, i): return torch.zeros(3, 32, 32, dtype=torch.uint8), 0
        make_views(as_streaming(Blank())).views_of(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        images = torch.randint(0, 256, (16384, 3, 32, 32), dtype=torch.uint8)
        view_a, view_b = make_views(as_streaming(Blank())).views_of(images)
        assert view_a.shape == (16384, 3, 32, 32)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - before)
    """)
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    growth_gib = float(result.stdout.strip().splitlines()[-1])
    # Measured 0.95 GiB (images 0.05, the two views 0.4, one call's copies and the allocator's
    # slack); 4.3 GiB with the calls unbounded.
    assert growth_gib < 2.0, growth_gib
