"""A warm starter for tests that starts no server: it records the environment key of each one it
would start (``WarmStarter.key``), so a test compares the servers a sweep would fork from."""

from harness.launch.ranks.warm import WarmStarter


class KeyRecorder(WarmStarter):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.keys: list[tuple] = []

    def prewarm(self, argv, env) -> int:
        if not self.runs(argv):
            return 0
        self.keys.append(self.key(env))
        return 1
