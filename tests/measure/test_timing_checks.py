"""worker.timing.batch_checks: when a host-ahead batch counts (lead, or a full launch queue)."""
from tptune.measure.worker.timing import (FED_MARGIN, SAFETY, WINDOW_MAX_ITERS, batch_checks, needed_sleep_ms, timed_iters)


def test_lead_when_the_host_finished_before_the_hold_ended():
    assert batch_checks(enqueue_ms=84.5, slept_ms=163.9, host_ms=1.7, gpu_ms=3.7, idle_marks=0) == (True, True)


def test_a_block_held_back_by_the_launch_queue_counts():
    """x2, 2-layer block: 12 iterations took 607 ms to enqueue against a 435 ms hold, the host launching
    one in ~9 ms with the GPU free against 79 ms of GPU: the queue, not the host, was the limit."""
    assert batch_checks(enqueue_ms=607.1, slept_ms=435.1, host_ms=8.7, gpu_ms=79.2, idle_marks=0) == (False, True)


def test_an_idle_mark_or_a_slow_host_fails_the_queue_check():
    assert batch_checks(607.1, 435.1, 8.7, 79.2, idle_marks=1) == (False, False)
    # FP8 proj at TP 2: host 2.3 ms vs GPU 1.6 ms per iteration: host-bound, the GPU can starve
    assert batch_checks(90.0, 60.0, 2.3, 1.6, 0) == (False, False)
    # the refill margin is FED_MARGIN x the host's launch time
    assert batch_checks(90.0, 60.0, 1.0, FED_MARGIN * 1.0 + 1e-6, 0) == (False, True)
    assert batch_checks(90.0, 60.0, 1.0, FED_MARGIN * 1.0, 0) == (False, False)


def test_a_long_window_counts_only_if_the_host_entered_it_ahead():
    """x2, proj with a 40-iteration batch: 205 ms to enqueue against a 168 ms hold (the launch queue),
    the host 1.3 ms against 2.7 ms of GPU per iteration: fed when it began the timed iterations first."""
    assert batch_checks(205.5, 168.1, 1.3, 2.73, 0, entered_ms=80.0) == (False, True)
    assert batch_checks(205.5, 168.1, 1.3, 2.73, 0, entered_ms=170.0) == (False, False)


def test_the_window_sets_the_iterations_of_gpu_bound_ops_only():
    assert timed_iters(10, host_ms=1.4, gpu_ms=3.6, window_ms=500) == 139       # ceil(500 / 3.6)
    assert timed_iters(10, 1.4, 80.0, 500) == 10                               # a block: iters already fill it
    assert timed_iters(10, 0.1, 0.2, 500) == WINDOW_MAX_ITERS
    assert timed_iters(10, 2.3, 1.6, 500) == 10                                # host-bound: the host enqueues all
    assert timed_iters(10, 1.4, 3.6, 0) == 10                                  # window off


def test_the_sleep_covers_the_pre_roll_for_gpu_bound_ops_and_everything_otherwise():
    # GPU-bound: 42 pre-roll iterations of 3.6 ms outlast their launches at 1.4 ms, whatever the window
    assert needed_sleep_ms(1.4, 3.6, 139, 42) == needed_sleep_ms(1.4, 3.6, 10, 42) == 2.0
    # host-bound: the host must enqueue pre-roll and batch during the hold
    assert needed_sleep_ms(2.3, 1.6, 10, 2) == 2.3 * 12 * SAFETY + 2.0 - 2 * 1.6


def test_a_host_bound_retry_shortens_the_pre_roll_and_sleeps_for_it():
    """x2, FP8 qkv under current scaling: host 4.4 ms against GPU 2.4 ms per iteration, 60 pre-roll
    iterations; the enqueue took the sleep plus ~30 ms at every sleep length. Each retry now quarters the
    pre-roll (to PREROLL_MIN) and sleeps at least what host x (iters + pre-roll) needs."""
    from tptune.measure.worker.timing import PREROLL_MIN, needed_sleep_ms, retry_plan

    sleep, preroll = 357.0, 60
    plan = []
    for _ in range(3):
        sleep_next, preroll = retry_plan(sleep, preroll, enqueue_ms=sleep + 30.0, host_ms=4.4, gpu_ms=2.4, iters=10)
        assert sleep_next >= 2 * sleep and sleep_next >= needed_sleep_ms(4.4, 2.4, 10, preroll)
        sleep = sleep_next
        plan.append(preroll)
    assert plan == [15, 3, PREROLL_MIN]
    # a GPU-bound op (bf16 proj: host 1.3, GPU 2.8) keeps its pre-roll; only the sleep grows
    assert retry_plan(100.0, 54, enqueue_ms=120.0, host_ms=1.3, gpu_ms=2.8, iters=10) == (242.0, 54)


def test_iteration_windows_place_each_iteration_in_host_time():
    from tptune.measure.worker.timing import iteration_windows

    class Ev:      # a recorded event: ms after the start event (what elapsed_time reads on a GPU)
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    start = Ev(0.0)
    marks = [(Ev(100.0), Ev(101.0), Ev(103.5)), (Ev(103.5), Ev(104.5), Ev(107.0))]
    assert iteration_windows(10.0, start, marks) == [(10.1, 10.1035), (10.1035, 10.107)]


def test_preroll_counts_the_warm_up_and_probe_iterations_run_just_before():
    from tptune.measure.worker.timing import PREROLL_MAX, PREROLL_MIN, preroll_iters

    assert preroll_iters(150, 3.6) == 42                     # qkv on x2, nothing run before
    assert preroll_iters(150, 3.6, warm_iters=6) == 36       # 22 ms of warm-up + probe already ran
    assert preroll_iters(150, 18.0, warm_iters=6) == 3       # fc1: 108 of the 150 ms
    assert preroll_iters(150, 30.0, warm_iters=6) == PREROLL_MIN   # the warm-up alone covers it
    assert preroll_iters(150, 0.5, warm_iters=6) == PREROLL_MAX    # a tiny op: capped
    assert preroll_iters(1000, 0.5) == 400                   # the cap scales with a longer pre-roll
