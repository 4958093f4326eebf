"""Two OpenEnv environments written as an OpenEnv user writes them (``Environment``, pydantic ``Action`` and
``Observation``, ``create_app``), served for the tests: ``python openenv_games.py guess|echo`` prints
``serving NAME on http://127.0.0.1:PORT`` once it listens.

- ``guess``: guess a number from 1 to 8 drawn from the reset's seed; the action is ``{"guess": int}`` (so the policy
  answers a JSON object), the feedback says higher or lower; reward 1 and ``done`` on the number, ``done`` after
  4 guesses. Its observation has two fields (feedback and guesses left), so the client renders them as JSON.
- ``echo``: the action is ``{"message": str}``, the observation ``{"echoed": str}``; ``done`` after 3 messages,
  reward the message's length. No seed, no success.
- ``lookup``: an MCP tool environment (``MCPEnvironment`` with FastMCP tools, OpenEnv's RFC 003): a directory of
  people drawn from the reset's seed; ``search(name)`` tells where one lives, ``answer(city)`` ends the episode with
  reward 1 when right. Its reset observation says whom to find.
"""

import random
import socket
import sys

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from pydantic import Field


class GuessAction(Action):
    guess: int = Field(ge=1, le=8, description="your guess, 1 to 8")


class GuessObservation(Observation):
    feedback: str = Field(description="what the last guess told")
    guesses_left: int = Field(description="guesses before the game ends")


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.number, self.left = State(), 1, 4

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.number, self.left = random.Random(seed).randint(1, 8), 4
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess a number from 1 to 8.", guesses_left=self.left)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.number:
            return GuessObservation(feedback="Right!", guesses_left=self.left, done=True, reward=1.0)
        side = "higher" if self.number > action.guess else "lower"
        return GuessObservation(
            feedback=f"{action.guess} is wrong: go {side}.", guesses_left=self.left, done=self.left == 0, reward=0.0
        )

    @property
    def state(self):
        return self._state


class EchoAction(Action):
    message: str = Field(description="the text to echo")


class EchoObservation(Observation):
    echoed: str = Field(default="", description="the last message")


class EchoEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed="Say something.")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return EchoObservation(
            echoed=action.message, reward=float(len(action.message)), done=self._state.step_count >= 3
        )

    @property
    def state(self):
        return self._state


class LookupObservation(Observation):
    question: str = Field(default="", description="whom to find")


class LookupEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("lookup")
        self.directory, self.person, self.answered = {}, "", None

        @mcp.tool()
        def search(name: str) -> str:
            """Look a person up in the directory."""
            city = self.directory.get(name)
            return f"{name} lives in {city}." if city else f"No one called {name}."

        @mcp.tool()
        def answer(city: str) -> str:
            """Give the final answer."""
            self.answered = city
            return "Noted."

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs):
        rng = random.Random(seed)
        self.directory = {name: rng.choice(["Oslo", "Lima", "Rome"]) for name in ("Ada", "Ben", "Cleo")}
        self.person, self.answered = rng.choice(sorted(self.directory)), None
        self._state = State(episode_id=episode_id, step_count=0)
        return LookupObservation(question=f"Where does {self.person} live?")

    # The WebSocket session steps through step_async (MCPEnvironment's own), HTTP through step: score both.
    def step(self, action, timeout_s=None, **kwargs):
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action, timeout_s=None, **kwargs):
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action, observation):
        if isinstance(action, CallToolAction) and action.tool_name == "answer":
            observation.done = True
            observation.reward = float(self.answered == self.directory[self.person])
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"error": "call a tool"})

    @property
    def state(self):
        return self._state


GAMES = {
    "guess": (GuessEnv, GuessAction, GuessObservation),
    "echo": (EchoEnv, EchoAction, EchoObservation),
    "lookup": (LookupEnv, CallToolAction, CallToolObservation),
}

if __name__ == "__main__":
    name = sys.argv[1]
    env, action, observation = GAMES[name]
    app = create_app(env, action, observation, env_name=name, max_concurrent_envs=64)
    listening = socket.create_server(("127.0.0.1", 0))
    print(f"serving {name} on http://127.0.0.1:{listening.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])
