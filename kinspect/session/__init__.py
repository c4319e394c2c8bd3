"""The connection pipeline: frames, pairs, transforms and reports each connection (sans-IO)."""

from kinspect.protocol.errors import DecodeError  # what an event's decode() or scan() raises
from kinspect.session.events import ConnectionInfo, Exchange, Problem, Request, Response
from kinspect.session.plan import Plan, ResponseTransform
from kinspect.session.session import Output, Session, SessionConfig

__all__ = ["ConnectionInfo", "DecodeError", "Exchange", "Output", "Plan", "Problem", "Request", "Response", "ResponseTransform",
           "Session", "SessionConfig"]
