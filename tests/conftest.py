"""Shared test set-up."""

import torch

# Tiny models gain nothing from intra-op threads, and OpenMP spin-waiting makes them
# 10-25x slower whenever the cores are shared with anything else.
torch.set_num_threads(1)
