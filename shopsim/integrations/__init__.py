"""Adapters to outside training and serving libraries (docs/clients.md).

* `shopsim.integrations.trl`: the shopping env as a TRL ``GRPOTrainer(environment_factory=...)`` environment class;
* `shopsim.integrations.openenv`: the shopping env behind an OpenEnv (``openenv-core``) server, with typed models;
  `shopsim.integrations.serve_guard` holds that server's limits and access rules.

Each imports its library only when used (install ``shopsim[trl]`` / ``shopsim[openenv]``).
"""
