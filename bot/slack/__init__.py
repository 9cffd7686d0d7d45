"""The Slack transport: the only package that imports slack_bolt and slack_sdk.

Handlers turn a Slack action into a ``PilotService`` call; ``SlackNotifier`` renders the
service's neutral messages as Block Kit, one visible message per (run, key).
"""
