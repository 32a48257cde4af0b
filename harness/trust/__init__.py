"""What the gate checks of a stored sweep before it judges by it: ``stored_plan`` (a stored
``plan.json`` is the plan the harness makes for the stored case, its case file unchanged) and
``golden_folders`` (golden folders lost or orphaned). Floor 7, beside ``report``, which gets
``check_stored_plan`` passed in."""
