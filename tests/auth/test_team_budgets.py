"""Owners set and raise their team's and keys' budgets within the operator's ceiling (auth/budget_rules.py), on
both stores: refused above it naming the field, refused without a ceiling, a soft budget refused where money is
capped, a ceiling never on a key, a member never, the operator never capped; the team's rates and ceiling kept."""

from __future__ import annotations

import pytest

from auth import AuthService
from auth.admin import Actor
from auth.errors import AuthError, RequestError
from auth.models import Ceiling, CreateKey, CreateTeam, CreateTeamKey, EditKey, Limits, SpendBudget, TeamBudgets
from auth.policy import Manager

ACTOR = Actor(id="test", source="test")
OWNER = Manager(user_id=None, is_admin=False, role="owner")
MEMBER = Manager(user_id="usr_x", is_admin=False, role="member")
OPERATOR = Manager(user_id=None, is_admin=True, role=None)
CEILING = Ceiling(spend_micros=100_000_000, monthly_tokens=1_000_000)


async def _refused(call, status: int, param: str, code: str | None = None) -> RequestError:
    with pytest.raises(RequestError) as refused:
        await call
    assert (refused.value.status, refused.value.param) == (status, param), refused.value
    assert code is None or refused.value.code == code
    assert param in str(refused.value)
    return refused.value


async def test_owners_budgets_stay_under_the_operators_ceiling(service: AuthService):
    ops, budgets = service.admin, service.team_budgets
    team = (await ops.create_team(ACTOR, CreateTeam(name="t", limits=Limits(rpm=60, ceiling=CEILING)))).id
    bare = (await ops.create_team(ACTOR, CreateTeam(name="bare"))).id

    await _refused(budgets.set(ACTOR, OWNER, bare, TeamBudgets(monthly_token_budget=5)), 403, "ceiling", "no_ceiling")
    above = await _refused(budgets.set(ACTOR, OWNER, team, TeamBudgets(
        spend_budget=SpendBudget(amount_micros=100_000_001), monthly_token_budget=10)), 403,
        "spend_budget.amount_micros", "above_ceiling")
    assert "$100.00" in str(above)
    await _refused(budgets.set(ACTOR, OWNER, team, TeamBudgets(spend_budget=SpendBudget(
        amount_micros=5_000_000, hard=False), monthly_token_budget=10)), 403, "spend_budget.hard")
    await _refused(budgets.set(ACTOR, OWNER, team, TeamBudgets(spend_budget=SpendBudget(amount_micros=5_000_000),
                                                               monthly_token_budget=1_000_001)),
                   403, "monthly_token_budget")
    await _refused(budgets.set(ACTOR, OWNER, team, TeamBudgets(monthly_token_budget=10)), 403, "spend_budget")
    with pytest.raises(AuthError):
        await budgets.set(ACTOR, MEMBER, team, TeamBudgets())

    # set, then raised to the ceiling itself: the rates and the ceiling stay, the change is audited
    for amount in (5_000_000, 100_000_000):
        out = await budgets.set(ACTOR, OWNER, team, TeamBudgets(spend_budget=SpendBudget(amount_micros=amount),
                                                                monthly_token_budget=1_000_000))
    assert out == Limits(rpm=60, monthly_token_budget=1_000_000, spend_budget=SpendBudget(amount_micros=100_000_000),
                         ceiling=CEILING)
    assert (await service.store.get_team(team)).limits == out
    assert [e.action for e in (await ops.team_audit_page(team, 10)).data].count("teams.budgets") == 2
    # the operator is not capped
    free = await budgets.set(ACTOR, OPERATOR, bare, TeamBudgets(spend_budget=SpendBudget(amount_micros=10**12)))
    assert free.spend_budget.amount_micros == 10**12


async def test_key_budgets_stay_under_the_ceiling_and_a_ceiling_is_never_a_keys(service: AuthService):
    ops, keys = service.admin, service.team_keys
    team = (await ops.create_team(ACTOR, CreateTeam(name="k", limits=Limits(ceiling=CEILING)))).id
    key = await keys.create(ACTOR, OWNER, team, CreateTeamKey(name="bot"))
    await _refused(keys.edit(ACTOR, OWNER, team, key.id, EditKey(limits=Limits(
        spend_budget=SpendBudget(amount_micros=100_000_001)))), 403, "spend_budget.amount_micros")
    await _refused(keys.edit(ACTOR, OWNER, team, key.id, EditKey(limits=Limits(monthly_token_budget=1_000_001))),
                   403, "monthly_token_budget")
    await _refused(keys.create(ACTOR, OWNER, team, CreateTeamKey(name="big", limits=Limits(
        spend_budget=SpendBudget(amount_micros=200_000_000)))), 403, "spend_budget.amount_micros")
    for manager in (OWNER, OPERATOR):
        await _refused(keys.edit(ACTOR, manager, team, key.id, EditKey(limits=Limits(ceiling=CEILING))),
                       400, "limits.ceiling")
    await _refused(ops.create_key(ACTOR, CreateKey(name="c", team_id=team, limits=Limits(ceiling=CEILING))),
                   400, "limits.ceiling")
    # raised step by step up to the ceiling; a soft key budget is fine (the team's hard one still applies)
    for amount in (1_000_000, 100_000_000):
        out = await keys.edit(ACTOR, OWNER, team, key.id, EditKey(limits=Limits(
            spend_budget=SpendBudget(amount_micros=amount, hard=False), monthly_token_budget=1_000_000)))
    assert out.limits.spend_budget.amount_micros == 100_000_000
    assert (await service.store.get_key(key.id)).limits.monthly_token_budget == 1_000_000
