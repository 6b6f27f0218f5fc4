"""Authorization lives in auth/policy.py alone (issue #46, item 3): the gateway's and auth's source is read and every
role, admin-key or team comparison outside that module is a failure (a route deciding for itself is a side door the
policy's tests never see); then each rule moved there is pinned, case by case."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from auth import policy
from auth.models import KeyRecord

REPO = Path(__file__).resolve().parents[2]
ROLE_WORDS = {policy.ADMIN, policy.SERVICE, policy.OWNER, policy.MEMBER}
ROLE_NAMES = {"ADMIN", "SERVICE", "OWNER", "MEMBER", "READERS", "BATCH_READERS"}  # `ROLES`: a chat message's too
TEAM_IDS = {"team_id", "id"}
TESTS = (ast.BoolOp, ast.UnaryOp, ast.Compare)


def _name(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _is_role(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ROLE_WORDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_role(element) for element in node.elts)
    # a team role held by an object (`member.role`, `scope.team.role`); a bare `role` is a chat message's too
    return (isinstance(node, ast.Attribute) and node.attr == "role") or _name(node) in ROLE_NAMES


def _decisions(source: str) -> list[tuple[int, str]]:
    """(line, what) of each authorization decision in `source`: an admin-key test (`x.is_admin` as a condition,
    not as an argument handed to a policy function), a comparison with a role, a team id compared with another."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            tested = isinstance(node, TESTS) or (isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert))
                                                 and child is node.test)
            if tested and isinstance(child, ast.Attribute) and child.attr == "is_admin":
                found.append((child.lineno, "an admin-key test"))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_role(side) for side in sides):
                found.append((node.lineno, "a role comparison"))
            elif (any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
                  and sum(_name(side) in TEAM_IDS for side in sides) >= 2
                  and any(_name(side) == "team_id" for side in sides)):
                found.append((node.lineno, "a team comparison"))
    return found


def test_no_authorization_decision_outside_the_policy():
    found = [f"{path.relative_to(REPO)}:{line}: {what}"
             for path in sorted([*(REPO / "gateway").rglob("*.py"), *(REPO / "auth").rglob("*.py")])
             if path != REPO / "auth" / "policy.py"
             for line, what in _decisions(path.read_text())]
    assert not found, "decide these in auth/policy.py and call the rule from there:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "what"), [
    ("if not user.is_admin:\n    raise denied", "an admin-key test"),
    ("x = caller is not None and caller.is_admin", "an admin-key test"),
    ("page = 'teams' if principal.is_admin else 'overview'", "an admin-key test"),
    ("ok = scope.team.role not in READERS", "a role comparison"),
    ("ok = member.role == 'owner'", "a role comparison"),
    ("ok = role in ('owner', 'member')", "a role comparison"),
    ("ok = principal.team_id == spec.team_id", "a team comparison"),
    ("ok = key.team_id != scope.team.id", "a team comparison"),
])
def test_the_scan_sees_each_kind_of_decision(source, what):
    assert _decisions(source) == [(1, what)]


@pytest.mark.parametrize("source", [
    "ok = uses_admin_api(caller.is_admin)",  # the fact handed to the policy
    "Session(is_admin=principal.is_admin)",
    "ok = message['role'] == 'assistant'",  # a chat message's role, not a team's
    "ok = role == 'user'",
    "ok = spec.team_id is None",
])
def test_the_scan_leaves_data_alone(source):
    assert _decisions(source) == []


# ---- the rules moved here ----

@pytest.mark.parametrize(("endpoint_team", "is_admin", "team_id", "sees"), [
    (None, False, None, True),  # a public endpoint: everyone's, even without a key
    (None, False, "team-b", True),
    ("team-a", False, "team-a", True),
    ("team-a", False, "team-b", False),  # another team's private endpoint
    ("team-a", False, None, False),  # no key: no private endpoint
    ("team-a", True, "ops", True),  # the operator
])
def test_sees_endpoint(endpoint_team, is_admin, team_id, sees):
    assert policy.sees_endpoint(endpoint_team, is_admin=is_admin, team_id=team_id) is sees


@pytest.mark.parametrize(("role", "reads"), [("owner", True), ("member", True), ("service", False),
                                             ("admin", False), (None, False)])
def test_reads_batches(role, reads):
    assert policy.reads_batches(role) is reads


@pytest.mark.parametrize(("is_admin", "key_team", "team", "whole"), [
    (False, "team-a", "team-a", True), (False, "team-b", "team-a", False), (True, "team-b", "team-a", True)])
def test_sees_key_whole(is_admin, key_team, team, whole):
    assert policy.sees_key_whole(is_admin, key_team, team) is whole


@pytest.mark.parametrize(("is_admin", "key_user", "sets"), [
    (True, "usr_1", True), (True, None, True), (False, None, True), (False, "usr_1", False)])
def test_sets_grants_and_grants_refusal_agree(is_admin, key_user, sets):
    assert policy.sets_grants(is_admin, key_user) is sets
    manager = policy.Manager(user_id="usr_owner", is_admin=is_admin, role=policy.OWNER)
    assert (policy.grants_refusal(manager, key_user, None, None) is None) is sets


@pytest.mark.parametrize("is_admin", [True, False])
def test_the_operators_powers(is_admin):
    assert policy.uses_admin_api(is_admin) is is_admin
    assert policy.sees_every_team(is_admin) is is_admin
    assert policy.shows_own_key_limits(is_admin) is not is_admin


@pytest.mark.parametrize(("role", "owner"), [("owner", True), ("member", False), ("service", False), (None, False)])
def test_is_owner_and_manages_keys(role, owner):
    assert policy.is_owner(role) is owner
    assert policy.manages_keys(False, role) is owner
    assert policy.manages_keys(True, role)


def key(*, user_id: str | None = None, team_id: str = "team-a", is_admin: bool = False) -> KeyRecord:
    return KeyRecord(id="k", secret_hash="", name="k", user_id=user_id, team_id=team_id, is_admin=is_admin,
                     models=(), limits=None, expires_at=None, revoked_at=None, created_at=0.0)


def test_acting_user():
    assert policy.acting_user(key(user_id="usr_1")) == "usr_1"
    assert policy.acting_user(key()) is None  # a service key
    assert policy.acting_user(key(user_id="usr_1", is_admin=True)) is None  # the operator's, whoever it names


@pytest.mark.parametrize(("record", "role", "listed"), [
    (key(), None, True),  # the team's own service key
    (key(team_id="team-b"), None, False),  # another team's service key
    (key(user_id="usr_1", team_id="team-b"), "member", True),  # a member's personal key made elsewhere
    (key(user_id="usr_1", team_id="team-b"), None, False),  # a stranger's
    (key(is_admin=True), None, False),  # an admin key is never a team's
])
def test_in_team_keys(record, role, listed):
    assert policy.in_team_keys(record, "team-a", role) is listed


@pytest.mark.parametrize(("key_is_admin", "viewer_is_operator", "hidden"), [
    (True, False, True), (True, True, False), (False, False, False), (False, True, False)])
def test_named_as_operator_and_capped(key_is_admin, viewer_is_operator, hidden):
    assert policy.named_as_operator(key_is_admin, viewer_is_operator) is hidden
    assert policy.capped(viewer_is_operator) is not viewer_is_operator
