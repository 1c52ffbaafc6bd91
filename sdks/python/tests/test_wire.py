"""The SDK's wire types against the server's own schema."""

from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

import httpx
from conftest import Server

from overseer import wire

# SDK type -> the server's schema of the same JSON.
TYPES: List[Tuple[Any, str]] = [
    (wire.Lease, "Lease"),
    (wire.LeaseRequest, "LeaseRequest"),
    (wire.HeartbeatRequest, "HeartbeatRequest"),
    (wire.HeartbeatResponse, "HeartbeatResponse"),
    (wire.CompleteRequest, "CompleteRequest"),
    (wire.FailRequest, "FailRequest"),
    (wire.ReportResult, "ReportResult"),
    (wire.Problem, "Problem"),
    (wire.HttpTarget, "HttpTarget"),
    (wire.WaitingReason, "WaitingReason"),
    (wire.Backoff, "Backoff"),
    (wire.CompensateSpec, "CompensateSpec"),
    (wire.StepSpec, "StepSpec"),
    (wire.JobSpec, "JobSpec"),
    (wire.Step, "StepView"),
    (wire.Job, "JobView"),
    (wire.RerunRequest, "RerunRequest"),
]


def schemas(server: Server) -> Dict[str, Any]:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    return dict(doc["components"]["schemas"])


def fields(schema: Dict[str, Any]) -> Tuple[Set[str], Set[str]]:
    return set(schema.get("properties", {})), set(schema.get("required", []))


def test_wire_types_match_the_openapi_schema(server: Server) -> None:
    # Proves the SDK cannot drift from the server: every typed dictionary it reads or sends has
    # exactly the fields of the matching schema in a real server's `GET /openapi.json`, and
    # every field the schema requires is required in the SDK's type too (the SDK may rely on it).
    found = schemas(server)
    for sdk, name in TYPES:
        assert name in found, f"the server has no schema {name}"
        props, required = fields(found[name])
        assert set(sdk.__annotations__) == props, (sdk.__name__, name)
        missing = required - set(sdk.__required_keys__)
        assert not missing, f"{sdk.__name__}: {sorted(missing)} are required by {name}"


def test_report_bodies_match_the_batch_variants(server: Server) -> None:
    # Proves the two entries of a `POST /v1/leases:report` batch, as `Report.body` builds them,
    # have the fields of the schema's `complete` and `fail` variants.
    variants = schemas(server)["LeaseOutcome"]["oneOf"]
    by_outcome = {v["properties"]["outcome"]["enum"][0]: v for v in variants}
    for sdk, outcome in [(wire.CompleteReport, "complete"), (wire.FailReport, "fail")]:
        props, required = fields(by_outcome[outcome])
        assert set(sdk.__annotations__) == props, outcome
        assert required <= set(sdk.__required_keys__), outcome
    from overseer.reports import Report

    assert set(Report("complete", result=1).body("l")) <= set(wire.CompleteReport.__annotations__)
    assert set(Report("fail", error="e").body("l")) == set(wire.FailReport.__annotations__)
