"""WorkloadQuotaPolicy validation: quantities, and one line naming the field for each defect."""
import pytest

from seedance.model.errors import BadInput
from seedance.quota.controller import load_policy_text
from seedance.quota.policy import parse_cpu, parse_labels, parse_memory

GOOD = """\
apiVersion: seedance/v1
kind: WorkloadQuotaPolicy
metadata: {name: encoders}
spec:
  workloadSelector: {matchLabels: {app: encoder}}
  quota: {cpu: "500m", memory: "256Mi"}
  burstable: true
  burst: {cpu: "1500m", whenPressureBelow: {cpu_some_avg10: 20}}
"""


def test_the_notes_policy():
    policy = load_policy_text(GOOD, "p.yaml")
    assert (policy.name, policy.cpu_millicores, policy.memory_bytes) == ("encoders", 500, 256 * 1024 * 1024)
    assert (policy.burst_cpu_millicores, policy.pressure_key, policy.pressure_below) == (1500, "cpu_some_avg10", 20.0)
    assert policy.matches({"app": "encoder", "tier": "x"}) and not policy.matches({"app": "decoder"})


@pytest.mark.parametrize("text, millis", [("500m", 500), ("1.5", 1500), ("2", 2000), (2, 2000), ("0.25", 250)])
def test_cpu_quantities(text, millis):
    assert parse_cpu(text, "f") == millis


@pytest.mark.parametrize("text, size", [("256Mi", 268435456), ("1Gi", 1073741824), ("2M", 2000000),
                                        ("1048576", 1048576), ("1.5Gi", 1610612736)])
def test_memory_quantities(text, size):
    assert parse_memory(text, "f") == size


@pytest.mark.parametrize("edit, field", [
    (("seedance/v1", "v2"), "apiVersion"),
    (("kind: WorkloadQuotaPolicy", "kind: Quota"), "kind"),
    (("{name: encoders}", "{name: Encoders_1}"), "metadata.name"),
    (('cpu: "500m", memory', 'cpu: "lots", memory'), "spec.quota.cpu"),
    (('memory: "256Mi"', 'memory: "256 megs"'), "spec.quota.memory"),
    (("{app: encoder}", "{}"), "spec.workloadSelector.matchLabels"),
    (("burstable: true", "burstable: yes please"), "spec.burstable"),
    (('cpu: "1500m"', 'cpu: "400m"'), "spec.burst.cpu"),
    (("cpu_some_avg10: 20", "cpu_some_avg5: 20"), "spec.burst.whenPressureBelow"),
    (("cpu_some_avg10: 20", "cpu_some_avg10: 120"), "spec.burst.whenPressureBelow.cpu_some_avg10"),
    (("  burstable: true\n", "  burstable: true\n  replicas: 3\n"), "spec: unknown field 'replicas'"),
])
def test_each_defect_names_its_field(edit, field):
    text = GOOD.replace(*edit)
    assert text != GOOD
    with pytest.raises(BadInput) as err:
        load_policy_text(text, "p.yaml")
    message = str(err.value)
    assert field in message and "\n" not in message


def test_bad_yaml_is_one_line():
    with pytest.raises(BadInput) as err:
        load_policy_text("spec: [unclosed\n", "p.yaml")
    assert "not valid YAML" in str(err.value)


def test_labels():
    assert parse_labels(["app=encoder", "tier=gold,zone=a"]) == {"app": "encoder", "tier": "gold", "zone": "a"}
    with pytest.raises(BadInput):
        parse_labels(["app"])


@pytest.mark.parametrize("field, text", [
    ("metadata.name", GOOD.replace("metadata: {name: encoders}", 'metadata: {name: "encoders\\n"}')),
    ("label", GOOD.replace("{app: encoder}", '{app: "encoder\\n"}')),
    ("label", GOOD.replace("{app: encoder}", '{"app\\n": encoder}')),
])
def test_a_trailing_newline_is_not_a_name(field, text):
    """Python's `$` matches before a final newline: "encoders\\n" passed the DNS-label check and
    then split a row of `quota list`.  A name is the whole string or nothing."""
    with pytest.raises(BadInput):
        load_policy_text(text, "p.yaml")
