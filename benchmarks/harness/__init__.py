"""Harness fidelity: what the harness measures against known truth, and what it costs (launch, telemetry, reports, gate)."""
