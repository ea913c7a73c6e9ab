"""Task ids for training and evaluation from the env's split manifest: re-exported from `shopsim.splits`.

The trainers import them from here; the manifests are read in `shopsim.splits` only, and the functions live there
so that the agents layer (`agents.lm.sft`) can use them without importing baselines.
"""

from __future__ import annotations

from shopsim.splits import eval_tasks, sample_tasks

__all__ = ["eval_tasks", "sample_tasks"]
