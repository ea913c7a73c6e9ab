"""Policies for shopsim envs: scripted experts, random agents, the transformers LM agent and torch nets.

`agents.make(name, env_id)` builds one; `agents.available(env_id)` lists the names. Keep shopsim in its own
virtual environment: `agents` is a generic top-level name that other packages use too.
"""

from agents.base import Agent, Decision, ScriptedAgent
from agents.registry import available, load_checkpoint, make, register, resolve, save_manifest

__all__ = [
    "Agent", "Decision", "ScriptedAgent", "available", "load_checkpoint", "make", "register", "resolve",
    "save_manifest",
]
