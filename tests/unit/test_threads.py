"""Overlapping `torch_threads` stretches (sessions of one server) never leave the thread count that later script
runs start with at 1: the last stretch to end puts the process's count back."""

from __future__ import annotations

import threading

import torch

from perm_core.run import threads


def count_in_a_new_thread() -> int:
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    worker.start()
    worker.join()
    return seen[0]


def test_overlapping_stretches_in_two_threads_restore_the_process_count(monkeypatch):
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "PROCESS_THREADS", 3)
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def session_a():
        with threads.one_thread():
            seen["a"] = torch.get_num_threads()
            a_inside.set()
            b_inside.wait()
        a_done.set()

    def session_b():  # starts inside A's stretch, so "the count before" it is A's 1
        a_inside.wait()
        with threads.torch_threads(2):
            seen["b"] = torch.get_num_threads()
            b_inside.set()
            a_done.wait()
            seen["new run meanwhile"] = count_in_a_new_thread()

    try:
        workers = [threading.Thread(target=session_a), threading.Thread(target=session_b)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert seen["a"] == 1 and seen["b"] == 1  # the smallest count asked for while both run
        assert seen["new run meanwhile"] == 2  # A has ended: B's 2 holds for runs started now
        assert count_in_a_new_thread() == 3  # both ended: the process's count, not a leftover 1
        assert threads._requests == []
    finally:
        torch.set_num_threads(saved)


def test_a_stretch_that_raises_still_ends(monkeypatch):
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "PROCESS_THREADS", 3)
    try:
        try:
            with threads.one_thread():
                raise ValueError("a failed run")
        except ValueError:
            pass
        assert threads._requests == [] and count_in_a_new_thread() == 3
    finally:
        torch.set_num_threads(saved)
