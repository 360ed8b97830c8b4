"""The goodput buckets and their names in ml-goodput-measurement (docs/goodput.md)."""

BUCKETS = ("productive", "program_startup", "training_preparation", "data_loading", "checkpoint_save",
           "checkpoint_restore", "wasted_progress", "infrastructure_recovery", "scheduling", "evaluation", "export",
           "other")
ML_GOODPUT = {"program_startup": "PROGRAM_STARTUP", "training_preparation": "TRAINING_PREP",
              "data_loading": "DATA_LOADING_SYNC", "checkpoint_save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
              "checkpoint_restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
              "wasted_progress": "WASTED_PROGRESS_FROM_DISRUPTION",
              "infrastructure_recovery": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
              "evaluation": "CUSTOM_BADPUT_EVENTS", "export": "CUSTOM_BADPUT_EVENTS", "other": "OTHER"}
PHASES = {"preparation": "training_preparation", "restore": "checkpoint_restore", "checkpoint": "checkpoint_save",
          "evaluation": "evaluation", "export": "export", "recovery": "infrastructure_recovery",
          "startup": "program_startup"}
