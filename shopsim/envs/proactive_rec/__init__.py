"""ProactiveRec-v0 (ProRL, arXiv 2605.28293): items with semantic IDs, a frozen next-item user simulator, the
per-step Gymnasium env and a batched whole-path scorer. See `env.ProactiveRecEnv` for the env documentation.
"""

from shopsim.envs.proactive_rec.env import ProactiveRecEnv
from shopsim.envs.proactive_rec.scoring import INVALID, STOP, PathScorer, PathScores, RewardWeights
from shopsim.envs.proactive_rec.semantic_ids import SemanticIDs, build_semantic_ids, item_embeddings
from shopsim.envs.proactive_rec.world import HISTORY_LEN, L_MAX, World, get_world

__all__ = ["HISTORY_LEN", "INVALID", "L_MAX", "PathScorer", "PathScores", "ProactiveRecEnv", "RewardWeights",
           "STOP", "SemanticIDs", "World", "build_semantic_ids", "get_world", "item_embeddings"]
