"""Print a CPU kernel set (``ATEN_CPU_CAPABILITY``) other than the one torch picks on this machine.

torch runs its vectorised kernels for the best instruction set the CPU has (``avx512`` on a
current Xeon, ``avx2`` on most others); ``default`` is the scalar build every x86-64 CPU runs.
The other set rounds reductions in another order, which is what a user's machine may do.
"""

import torch

native = torch.backends.cpu.get_cpu_capability().lower()
print("avx2" if native.startswith("avx512") else "default")
