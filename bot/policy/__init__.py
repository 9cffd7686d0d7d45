"""The bot's own policy: who may submit, approve and move leases, and what a manifest
posted in Slack may run or read. A manifest can only narrow it, never widen it."""

from bot.policy.checks import Identity, Refusal
from bot.policy.load import Policy, default_policy, load_policy, policy_for

__all__ = ["Identity", "Policy", "Refusal", "default_policy", "load_policy", "policy_for"]
