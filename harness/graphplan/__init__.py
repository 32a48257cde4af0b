"""What a graph arm plans, without torch (floor 2: it reads only ``spec`` and the pure planner of
``slotmem``): ``layout`` (a graph arm's slot-plan layout per PP rank and the microbatch counts
the plan covers: the capture, the memory plan and ``compare.slot_ring`` plan from it) and
``render`` (a slot plan as text and JSON: ``dcp-harness plan``)."""
