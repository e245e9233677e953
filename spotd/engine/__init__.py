"""The reconcile loop: attempts, gangs, checkpoints and progress, the policy's context."""
