"""Environments written to TRL's documented ``environment_factory`` contract, as a TRL user writes them: a class built
with no arguments, ``reset(**row)`` returning the text that follows the prompt, public methods with type hints and
Google docstrings as tools, and ``get_reward()``. Nothing here knows about rllib_ragen."""


class CounterEnv:
    """Reach a target by adding to a counter."""

    def __init__(self):
        self.counter = 0
        self.target = 0

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = int(kwargs["target"])
        return f"The counter is at 0; the target is {self.target}."

    def add(self, amount: int) -> str:
        """Add an amount to the counter.

        Args:
            amount: how much to add (1 to 9).
        """
        if not 1 <= amount <= 9:
            raise ValueError("amount must be between 1 and 9")
        self.counter += amount
        return f"The counter is at {self.counter}."

    async def double(self) -> str:
        """Double the counter (an async tool, as TRL allows)."""
        self.counter *= 2
        return f"The counter is at {self.counter}."

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else 0.0


TASKS = [
    {"prompt": [{"role": "user", "content": "Bring the counter to its target."}], "target": target}
    for target in (3, 12, 7)
]
