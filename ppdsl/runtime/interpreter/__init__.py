"""The interpreter: a rank's program compiled to ops, the schedule that orders them, the
stages that compute, and each action kind's handler."""
