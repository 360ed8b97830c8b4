"""The TensorFlow launcher: TF_CONFIG, tf.distribute strategies, the Keras loop, servers and the evaluator."""
