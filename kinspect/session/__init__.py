"""Per-connection inspection: frames to Request, Response and Exchange events (sans-IO)."""

from kinspect.session.connection import Session, SessionConfig
from kinspect.session.events import ConnectionInfo, Exchange, Problem, Request, Response

__all__ = ["ConnectionInfo", "Exchange", "Problem", "Request", "Response", "Session", "SessionConfig"]
