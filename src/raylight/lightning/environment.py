"""RaylightEnvironment: how Lightning learns a worker's place in the group.

raylight's worker group assigns ranks and forms the process group before Lightning
runs, so this environment only reports what raylight decided: the setters Lightning
calls are no-ops (the world is fixed by the placement group, not by Lightning's device
count) and ``creates_processes_externally`` is true (Lightning must not spawn anything).
"""

from __future__ import annotations

from lightning.fabric.plugins.environments import ClusterEnvironment


class RaylightEnvironment(ClusterEnvironment):
    """Ranks and world size of one raylight worker (or of the driver, before launch)."""

    def __init__(
        self,
        *,
        world_size: int = 1,
        global_rank: int = 0,
        local_rank: int = 0,
        node_rank: int = 0,
        main_address: str = "127.0.0.1",
        main_port: int = 0,
    ) -> None:
        self._world_size = world_size
        self._global_rank = global_rank
        self._local_rank = local_rank
        self._node_rank = node_rank
        self._main_address = main_address
        self._main_port = main_port

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return False  # only ever given explicitly, by RayStrategy

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        pass  # fixed by raylight's worker group

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        pass  # fixed by raylight's worker group

    def local_rank(self) -> int:
        return self._local_rank

    def node_rank(self) -> int:
        return self._node_rank

    def __repr__(self) -> str:
        return f"RaylightEnvironment(rank={self._global_rank}, world_size={self._world_size})"
