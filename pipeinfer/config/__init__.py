"""The configuration of a job, built once from the command line and shared by every rank."""
