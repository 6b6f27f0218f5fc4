"""The native decode step's thread count: the faster of one thread and the team, measured per size."""

from worker.engine.thread_choice import EXPLORE_EVERY, TRIAL_STEPS, ThreadChoice


def _run(choice: ThreadChoice, rows: int, team: int, seconds: dict[int, float], steps: int) -> list[int]:
    picked = []
    for _ in range(steps):
        threads = choice.pick(rows, team)
        choice.record(rows, threads, seconds[threads])
        picked.append(threads)
    return picked


def test_each_count_is_measured_first_then_the_faster_runs_and_the_other_is_tried_now_and_then():
    choice = ThreadChoice()
    picked = _run(choice, 1, 2, {1: 0.010, 2: 0.015}, 3 * EXPLORE_EVERY)
    assert picked[:5] == [2, 2, 1, 1, 1]  # a step after a change is not measured: two steps each to start
    assert picked.count(2) == 2 + 3 * TRIAL_STEPS  # its first measure, then a try in each EXPLORE_EVERY steps
    assert all(picked[i] == 2 for i in range(EXPLORE_EVERY - 1, 3 * EXPLORE_EVERY, EXPLORE_EVERY))


def test_a_step_right_after_a_change_of_count_does_not_count():
    choice = ThreadChoice()
    for threads, seconds in ((2, 0.009), (2, 0.009), (1, 0.050), (1, 0.012)):  # the slow one came after a change
        choice.record(1, threads, seconds)
    assert choice.pick(1, 2) == 2


def test_the_choice_follows_the_host_when_the_other_count_becomes_faster():
    choice = ThreadChoice()
    _run(choice, 1, 2, {1: 0.010, 2: 0.015}, EXPLORE_EVERY)
    later = _run(choice, 1, 2, {1: 0.010, 2: 0.006}, 4 * EXPLORE_EVERY)  # the co-located process went away
    assert later[-EXPLORE_EVERY:].count(2) == EXPLORE_EVERY - TRIAL_STEPS


def test_sizes_are_measured_apart_and_a_capped_team_is_taken_as_it_is():
    choice = ThreadChoice()
    _run(choice, 1, 2, {1: 0.010, 2: 0.015}, EXPLORE_EVERY)
    sixteen = _run(choice, 16, 2, {1: 0.080, 2: 0.045}, EXPLORE_EVERY)  # 16 rows: measured on their own
    assert sixteen[:4] == [2, 2, 1, 1] and sixteen.count(1) == 2 + TRIAL_STEPS
    assert choice.pick(1, 1) == 1 and choice.pick(16, 1) == 1  # the host allows one thread: nothing to choose
