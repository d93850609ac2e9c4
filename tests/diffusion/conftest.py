"""Diffusion tests run single-threaded: the tiny models are overhead-bound, and on a shared 2-core machine
torch's thread pool spins against other processes (measured: a tiny Wan call takes 0.3 s on 1 thread, 4 s on 2
threads under load)."""

import torch

torch.set_num_threads(1)
