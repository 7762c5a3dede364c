"""Smart home: find devices by room, set the thermostat, turn lights off, arm a scene.

Scripted solution: ``SmartHomeEnv(...).solution_calls()`` after ``reset(seed)`` (``solution()``
writes it as text). Each call that completes a request ends its result with the next one
(``ToolUseBaseEnv``'s notice); ``<answer>done</answer>`` ends the episode after the last.
"""

import json
import random


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


class SmartHomeEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        rooms = ["kitchen", "bedroom", "study", "hall"]
        devices = {}
        for room in rooms:
            devices[f"light-{room}"] = {"room": room, "kind": "light", "on": True}
        devices["thermo-main"] = {"room": "hall", "kind": "thermostat", "target": rng.randint(17, 20)}
        self._room = rng.choice(rooms)
        self._temp = rng.randint(21, 24)
        self._state = {"devices": devices, "scene": "home"}
        self._tools = {
            "list_devices": {"description": "Devices in a room.",
                             "parameters": _schema({"room": {"type": "string", "enum": rooms}}, ["room"])},
            "set_power": {"description": "Switch a device on or off.",
                          "parameters": _schema({"device_id": {"type": "string"},
                                                 "state": {"type": "string", "enum": ["on", "off"]}},
                                                ["device_id", "state"])},
            "set_temperature": {"description": "Set a thermostat's target in Celsius.",
                                "parameters": _schema({"device_id": {"type": "string"},
                                                       "celsius": {"type": "integer"}}, ["device_id", "celsius"])},
            "set_scene": {"description": "Switch the house scene.",
                          "parameters": _schema({"scene": {"type": "string", "enum": ["home", "away", "night"]}},
                                                ["scene"])},
            "play_music": {"description": "Play a playlist on the speakers.",
                           "parameters": _schema({"playlist": {"type": "string"}}, ["playlist"])},
        }
        self._user_messages = [
            f"It's cold: set the thermostat to {self._temp} degrees.",
            f"Turn off the light in the {self._room}.",
            "We're leaving now, switch the house to away mode.",
        ]
        self._message_criteria = [
            lambda s: s["devices"]["thermo-main"]["target"] == self._temp,
            lambda s: not s["devices"][f"light-{self._room}"]["on"],
            lambda s: s["scene"] == "away",
        ]
        self._current_msg = 0
        return self._user_messages[0], {}

    def tool_list_devices(self, room):
        return ", ".join(d for d, v in self._state["devices"].items() if v["room"] == room) or "none"

    def tool_set_power(self, device_id, state):
        device = self._state["devices"][device_id]
        if device["kind"] != "light":
            return f"{device_id} has no power switch"
        device["on"] = state == "on"
        return f"{device_id} is {state}"

    def tool_set_temperature(self, device_id, celsius):
        device = self._state["devices"][device_id]
        if device["kind"] != "thermostat":
            return f"{device_id} is not a thermostat"
        device["target"] = int(celsius)
        return f"{device_id} target {celsius} C"

    def tool_set_scene(self, scene):
        self._state["scene"] = scene
        return f"scene: {scene}"

    def tool_play_music(self, playlist):
        return f"playing {playlist}"

    def solution_calls(self):
        return [("list_devices", {"room": "hall"}), ("set_temperature", {"device_id": "thermo-main",
                                                                          "celsius": self._temp}),
                ("list_devices", {"room": self._room}), ("set_power", {"device_id": f"light-{self._room}",
                                                                       "state": "off"}),
                ("set_scene", {"scene": "away"})]

    def solution(self):
        """The tool calls of ``solution_calls()`` in order, then the final answer."""
        calls = [f"{name}({json.dumps(arguments)})" for name, arguments in self.solution_calls()]
        return " -> ".join(calls + ["<answer>done</answer>"])
