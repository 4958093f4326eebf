"""FactLookup: a question about a generated directory that only its tools can answer.

Each episode draws a directory of people and the cities they live in, and asks where one of them lives. The agent
cannot know: it must ``search`` the directory for the person (one turn), read the result, and ``answer`` with the city
(a later turn: the answer depends on what the search returned). A correct answer pays 1 and succeeds; a wrong one ends
the episode with 0. Guessing a city without searching succeeds one time in ``len(CITIES)``.
"""

from __future__ import annotations

from .tool_env import ToolTextEnv

PEOPLE = (
    "Ada",
    "Ben",
    "Cleo",
    "Dan",
    "Eve",
    "Finn",
    "Gus",
    "Hana",
    "Ivo",
    "Jade",
    "Kai",
    "Lena",
    "Milo",
    "Nora",
    "Otto",
    "Pia",
)
CITIES = ("Paris", "Oslo", "Lima", "Rome", "Cairo", "Quito", "Dakar", "Hanoi")


class FactLookupEnv(ToolTextEnv):
    """Find where a person lives with ``search``, then ``answer`` with the city.

    Args:
        directory_size: people in each episode's directory (each lives in a city drawn at random).
    """

    instructions = (
        "Answer the question with the answer tool. You cannot know the answer: search the directory for "
        "the person first, then answer with the city the search returns."
    )
    tool_names = ("search", "answer")

    def __init__(self, directory_size: int = 6, render_mode: str | None = "ansi", max_observation_chars: int = 4096):
        if not 1 <= directory_size <= len(PEOPLE):
            raise ValueError(f"directory_size={directory_size} must be between 1 and {len(PEOPLE)}.")
        super().__init__(render_mode, max_observation_chars)
        self.directory_size = directory_size
        self.directory: dict[str, str] = {}
        self.person = ""

    def _reset_state(self) -> None:
        people = self.np_random.choice(len(PEOPLE), size=self.directory_size, replace=False)
        self.directory = {PEOPLE[i]: CITIES[self.np_random.integers(len(CITIES))] for i in people}
        self.person = PEOPLE[people[self.np_random.integers(self.directory_size)]]

    def _render_text(self) -> str:
        return f"Question: In which city does {self.person} live?"

    def search(self, name: str) -> str:
        """Look a person up in the directory.

        Args:
            name: the person's name.
        """
        city = self.directory.get(name.strip().capitalize())
        return f"{name.strip()} lives in {city}." if city else f"No one called {name.strip()} is in the directory."

    def answer(self, city: str) -> str:
        """Give the final answer; this ends the episode.

        Args:
            city: the city the person lives in.
        """
        correct = city.strip().lower() == self.directory[self.person].lower()
        self._pay(1.0 if correct else 0.0)
        self._end_episode(success=correct)
        return "Correct." if correct else "Wrong."

    def optimal_solution_length(self) -> int:
        return 2
