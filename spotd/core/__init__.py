"""The core model: values, job states and their transitions, contracts, the instance and
fabric catalog, the job spec. No I/O, no SDKs: every other package builds on this one."""
