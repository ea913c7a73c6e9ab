"""Shared RL math and plumbing used by every baseline (docs/algorithms/core.md).

* `baselines.core.stats`      - masked mean/var/whiten, group statistics by any key (GRPO, GiGPO, RLOO, ARC).
* `baselines.core.gae`        - vectorised GAE (blocked scan, no Python loop over time): token-level over generated
  tokens skipping env tokens, turn-level over turn boundaries, per-row / per-step λ.
* `baselines.core.losses`     - loss aggregation modes (+ step-wide weights), clipped surrogate (clip-higher, dual
  clip), K1/K3 KL, entropy, value loss.
* `baselines.core.batch`      - the training batch built from `Trajectory` lists (concat and window context modes).
* `baselines.core.advantages` - batch-aware helpers (returns-to-go, token rewards, token GAE for a batch).
* `baselines.core.value_head` - critic: scalar head on a copy of (or on) the policy backbone.
* `baselines.core.loop`       - the one training loop of every algorithm (`LoopAlgorithm`: seeded, resumable,
  metrics.csv, TensorBoard, progress); algorithms override its steps.
* `baselines.core.config`, `baselines.core.trainer` - `LMConfig` and the LM algorithms' steps (`LMAlgorithm`).
* `baselines.core.tasks`      - train/eval task ids from the split manifests.
"""
