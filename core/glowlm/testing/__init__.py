"""Helpers for glowlm's tests and for plugin authors' contract tests (the ``dev`` extra).

- :mod:`glowlm.testing.contract`: the platform contract suite (one module per kind of check);
- :mod:`glowlm.testing.hosts`: recorded host dumps, as package data;
- :mod:`glowlm.testing.tiny_models`: tiny seeded checkpoints of every architecture;
- :mod:`glowlm.testing.server`: a real ``glowlm serve`` subprocess for HTTP tests;
- :mod:`glowlm.testing.parallel`: the TP / PP / multi-host tests' workload and TP = 1
  reference tokens;
- :func:`current_platform` / :func:`use_platform`: the process's platform in a test,
  and pinning one instance (a platform built for a recorded host, say).
"""

from glowlm.platforms import current_platform, use_platform

__all__ = ["current_platform", "use_platform"]
