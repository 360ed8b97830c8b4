"""Raise the error Keras 3's model.fit raised across two workers: a PerReplica value converted to a tensor.

Two logical CPUs under MirroredStrategy make a real PerReplica of 8x8 tensors; its repr (every value) floods the
exception's message, as Keras 3's did.
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
value = strategy.experimental_distribute_values_from_function(lambda ctx: tf.random.normal((8, 8)))
tf.constant(value)  # what Keras 3 met: its batch reduced as a whole reaches EagerTensor(value)
