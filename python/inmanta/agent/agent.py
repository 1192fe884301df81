"""`inmanta.agent.agent` for modules that import it to name types (`AgentInstance` in their
handlers' signatures). Steward's executors are not Inmanta agents: what a handler gets as its
agent is the handler host's own object, with the attributes handlers read (`name`, `uri`,
`eventloop`)."""

from typing import Any


class AgentInstance:
    """What `HandlerAPI.__init__(agent)` receives, as a type."""

    name: str
    uri: str
    eventloop: Any


class Agent:
    """The agent process, as a type."""
