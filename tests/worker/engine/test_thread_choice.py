"""The native decode step's thread count: the faster of one thread and the team, measured per size."""

from worker.engine.thread_choice import EXPLORE_EVERY, MAX_EXPLORE_EVERY, TRIAL_STEPS, ThreadChoice


def _run(choice: ThreadChoice, rows: int, team: int, seconds: dict[int, float], steps: int) -> list[int]:
    picked = []
    for _ in range(steps):
        threads = choice.pick(rows, team)
        choice.record(rows, threads, seconds[threads])
        picked.append(threads)
    return picked


def _tries(picked: list[int], loser: int) -> list[int]:
    """The steps where a try of the losing count starts (after the first measures of both)."""
    return [i for i in range(5, len(picked)) if picked[i] == loser and picked[i - 1] != loser]


def test_each_count_is_measured_first_then_the_faster_runs_and_the_other_is_tried_ever_less_often():
    choice = ThreadChoice()
    picked = _run(choice, 1, 2, {1: 0.010, 2: 0.015}, 500)
    assert picked[:5] == [2, 2, 1, 1, 1]  # a step after a change is not measured: two steps each to start
    tries = _tries(picked, 2)
    first = EXPLORE_EVERY - TRIAL_STEPS
    # each try that finds the team 1.5x slower again doubles the wait before the next, up to MAX_EXPLORE_EVERY
    assert tries == [first, first + 16, first + 48, first + 112, first + 240, first + 368]
    assert all(picked[t:t + TRIAL_STEPS] == [2] * TRIAL_STEPS for t in tries)
    assert MAX_EXPLORE_EVERY == 128


def test_a_close_race_is_tried_every_few_steps():
    choice = ThreadChoice()
    picked = _run(choice, 1, 2, {1: 0.010, 2: 0.011}, 6 * EXPLORE_EVERY)
    assert _tries(picked, 2) == list(range(EXPLORE_EVERY - TRIAL_STEPS, 6 * EXPLORE_EVERY, EXPLORE_EVERY))


def test_a_step_right_after_a_change_of_count_does_not_count():
    choice = ThreadChoice()
    for threads, seconds in ((2, 0.009), (2, 0.009), (1, 0.050), (1, 0.012)):  # the slow one came after a change
        choice.record(1, threads, seconds)
    assert choice.pick(1, 2) == 2


def test_the_choice_follows_the_host_at_its_next_try_and_tries_again_soon():
    choice = ThreadChoice()
    before = _run(choice, 1, 2, {1: 0.010, 2: 0.015}, 3 * EXPLORE_EVERY)
    waited = 3 * EXPLORE_EVERY - (_tries(before, 2)[-1] + TRIAL_STEPS)
    later = _run(choice, 1, 2, {1: 0.010, 2: 0.006}, 4 * MAX_EXPLORE_EVERY)  # the co-located process went away
    switched = later.index(2)
    assert switched + waited <= 4 * EXPLORE_EVERY  # at the next try, as scheduled before the change
    assert later[switched + TRIAL_STEPS:switched + TRIAL_STEPS + 8] == [2] * 8  # one measure replaced the old one
    # a new winner's race starts over: its first try of the other count comes EXPLORE_EVERY steps later
    assert _tries(later[switched:], 1)[0] <= EXPLORE_EVERY


def test_a_host_that_slows_the_faster_count_switches_at_once():
    choice = ThreadChoice()
    _run(choice, 16, 2, {1: 0.080, 2: 0.045}, 5 * EXPLORE_EVERY)  # the team wins; its tries are rare by now
    later = _run(choice, 16, 2, {1: 0.080, 2: 0.200}, 12)  # a neighbour wakes: the team's steps are measured
    assert later[-4:] == [1, 1, 1, 1] and later.index(1) <= 6


def test_sizes_are_measured_apart_and_a_capped_team_is_taken_as_it_is():
    choice = ThreadChoice()
    _run(choice, 1, 2, {1: 0.010, 2: 0.015}, EXPLORE_EVERY)
    sixteen = _run(choice, 16, 2, {1: 0.080, 2: 0.045}, EXPLORE_EVERY)  # 16 rows: measured on their own
    assert sixteen[:4] == [2, 2, 1, 1] and sixteen.count(1) == 2 + TRIAL_STEPS
    assert choice.pick(1, 1) == 1 and choice.pick(16, 1) == 1  # the host allows one thread: nothing to choose
