"""CallbackHandler calls only the callbacks that override an event (an event nobody overrides costs
one dict look-up, twice a step), and still every one that does, in order, including callbacks
added after events were dispatched and handlers set on an instance."""

from __future__ import annotations

import gputrain as gt
from gputrain.trainer_callback import CallbackHandler, TrainerControl, TrainerState


class Counts(gt.TrainerCallback):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def on_step_end(self, args, state, control, **kwargs):
        self.calls.append((self.name, sorted(kwargs)))


def test_overriding_callbacks_are_called_in_order_with_the_objects_and_the_event_arguments():
    calls = []
    handler = CallbackHandler([Counts("a", calls), gt.TrainerCallback(), Counts("b", calls)], model="m")
    args, state = gt.TrainingArguments(), TrainerState()
    control = handler.call_event("on_step_end", args, state, TrainerControl(), logs={})
    assert isinstance(control, TrainerControl)
    assert calls == [("a", ["logs", "model"]), ("b", ["logs", "model"])]
    assert handler.call_event("on_step_begin", args, state, control) is control


def test_a_callback_added_later_and_an_instance_handler_get_their_events():
    calls = []
    handler = CallbackHandler([Counts("a", calls)])
    args, state = gt.TrainingArguments(), TrainerState()
    handler.call_event("on_step_end", args, state, TrainerControl())
    handler.call_event("on_epoch_end", args, state, TrainerControl())
    handler.add_callback(Counts("late", calls))
    plain = gt.TrainerCallback()
    plain.on_epoch_end = lambda args, state, control, **kwargs: calls.append(("instance", []))
    handler.add_callback(plain)
    handler.call_event("on_step_end", args, state, TrainerControl())
    handler.call_event("on_epoch_end", args, state, TrainerControl())
    assert calls == [("a", []), ("a", []), ("late", []), ("instance", [])]
