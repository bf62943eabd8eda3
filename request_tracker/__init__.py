"""FLStore request tracker: query API, routing to cache functions, progress, failover."""

from request_tracker.errors import TrackerError
from request_tracker.service import create_app
from request_tracker.settings import TrackerSettings
from request_tracker.tracker import Tracker

__all__ = ["Tracker", "TrackerError", "TrackerSettings", "create_app"]
