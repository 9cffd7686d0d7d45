"""The service: ``PilotService`` and the parts it holds (records, publisher, follower).

``from bot.service import PilotService`` is how transports and the composition root
(``bot.compose``) reach it; the parts live in this package's modules.
"""

from bot.service.pilot_service import PilotService, Submission

__all__ = ["PilotService", "Submission"]
