"""What a name that arrives from telemetry or the config may be: the one validation of identifiers.

A GPU model, team, department, job, node, namespace, user, pod or container name reaches gpuledger from
places an attacker can write: a compromised node's agent, a pod label a user sets, a sacct dump. Those
names are later written into shell scripts (the Slurm plan), YAML (KAI, Kueue, Volcano), HTML (the report),
Markdown (the dashboard's labels) and CSV (the team files). Every writer escapes for its own target, and
besides that every name is held to a documented character set and length *before* it is stored, so a
writer that forgets to escape still has nothing dangerous to write.

The rule, per kind (`IDENTIFIERS`): printable ASCII letters, digits and `. _ : @ / + -` (the characters that
Kubernetes names and label values, Slurm accounts, job ids like `1234_5.batch`, UUIDs and MIG profiles like
`1g.10gb+me` use), starting with a letter, digit or underscore (so never a CSV formula: `= + - @`), at most
the kind's length. Only the driver's raw model string may also hold single spaces (`NVIDIA H100 80GB HBM3`).
No quotes, `$`, backticks, `;`, `|`, `&`, brackets, parentheses, `<`, `>`, `#`, `!`, `*`, whitespace other
than that space, control characters or non-ASCII letters: none is needed by a real name, and each is
syntax in one of the targets above.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.collector.errors import InputError

_FIRST = "A-Za-z0-9_"
_REST = "A-Za-z0-9._:@/+"  # "-" goes last in the class, after an optional space


@dataclass(frozen=True)
class IdentifierKind:
    """One kind of name: what it is called in messages, its longest length, whether single spaces may occur."""
    label: str
    max_len: int
    spaces: bool = False

    @property
    def pattern(self) -> str:
        rest = _REST + (" " if self.spaces else "") + "-"
        return f"^[{_FIRST}][{rest}]{{0,{self.max_len - 1}}}$"

    def matches(self, value: str) -> bool:
        return bool(re.fullmatch(self.pattern[1:-1], value)) and (not self.spaces or "  " not in value) \
            and value == value.rstrip()


# Each kind once. Lengths: Kubernetes names (a DNS subdomain, 253) and label values / namespaces (63); the rest
# generous for their sources (Slurm job ids with array and step suffixes, e-mail-like user names).
IDENTIFIERS: dict[str, IdentifierKind] = {
    "node": IdentifierKind("node name", 253),
    "gpu_uuid": IdentifierKind("GPU UUID", 96),
    "gpu_model": IdentifierKind("GPU model", 64),
    "model_name": IdentifierKind("GPU model name", 96, spaces=True),
    "mig_profile": IdentifierKind("MIG profile", 32),
    "namespace": IdentifierKind("namespace", 63),
    "pod": IdentifierKind("pod name", 253),
    "container": IdentifierKind("container name", 63),
    "job_id": IdentifierKind("job id", 253),
    "user": IdentifierKind("user name", 128),
    "team": IdentifierKind("team name", 63),
    "department": IdentifierKind("department name", 63),
    "node_pool": IdentifierKind("node pool name", 63),  # a Kubernetes label value, or a name the config gives
    "source": IdentifierKind("source name", 32),
    "dra_claim": IdentifierKind("DRA claim (namespace/name)", 317),  # a namespace (63) / a claim's name (253)
    "dra_device": IdentifierKind("DRA device (driver/pool/device)", 317),
}

# the sample columns that hold names (collector/samples.py: SAMPLE_SCHEMA), each checked at ingest
SAMPLE_NAME_COLUMNS = ("node", "gpu_uuid", "gpu_model", "model_name", "mig_profile", "namespace", "pod",
                       "container", "job_id", "user", "team", "source", "dra_claim", "dra_device")


def describe(kind: str) -> str:
    """The rule for a kind of name, in words, for error messages and docs."""
    spec = IDENTIFIERS[kind]
    spaces = ", single spaces inside" if spec.spaces else ""
    return (f"a {spec.label} is 1-{spec.max_len} ASCII letters, digits and . _ : @ / + -{spaces}, "
            f"starting with a letter, digit or _")


def is_identifier(kind: str, value: object) -> bool:
    """Whether `value` is a valid name of this kind."""
    return isinstance(value, str) and IDENTIFIERS[kind].matches(value)


def check_identifier(kind: str, value: object, where: str) -> str:
    """`value` if it is a valid name of this kind; else an InputError that says where it was and the rule
    (the value is shown escaped, since it may hold anything)."""
    if not is_identifier(kind, value):
        shown = ascii(value) if isinstance(value, str) else type(value).__name__
        raise InputError(f"{where}: {shown[:80]} is not a valid {IDENTIFIERS[kind].label}: {describe(kind)}")
    return value  # type: ignore[return-value]


def invalid_mask(kind: str, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """For a string column: true where a non-null value is not a valid name of this kind (nulls are false:
    whether a column may be null is the caller's rule)."""
    spec = IDENTIFIERS[kind]
    bad = pc.invert(pc.match_substring_regex(values, spec.pattern))
    if spec.spaces:
        bad = pc.or_(bad, pc.or_(pc.match_substring(values, "  "), pc.ends_with(values, " ")))
    return pc.fill_null(bad, False)
