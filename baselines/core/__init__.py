"""Shared RL math and plumbing used by every baseline (design document §6, algorithms.md §0.3).

* `baselines.core.stats`  - masked mean/var/whiten, group statistics by any key (GRPO, GiGPO, RLOO, ARC).
* `baselines.core.gae`    - vectorised GAE (blocked scan, no Python loop over time): token-level over generated
  tokens skipping env tokens, and turn-level over turn boundaries.
* `baselines.core.losses` - loss aggregation modes, clipped surrogate (with dual clip), K1/K3 KL, entropy, value loss.
* `baselines.core.batch`  - the training batch built from `Trajectory` lists (concat and window context modes).
* `baselines.core.value_head`, `baselines.core.trainer` - critic head and the shared LM training loop.
"""
