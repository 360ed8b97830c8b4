"""The Vertex AI multi-worker codelab's trainer/task.py, as users write it, parameterised by argv.

Only the constants became arguments (data dir, output dir, epochs, image size) and, as TensorFlow's
multi-worker tutorial does, non-chiefs remove their ``workertemp_`` copy after saving. The
entrypoint runs it unchanged: ``python -m entrypoint run --script tests/tensorflow/codelab_task.py
-- --data-dir D --output-dir O``.
"""

import argparse
import os

import tensorflow as tf

NUM_CLASSES = 3
BATCH_SIZE = 8


def create_datasets(data_dir, batch_size, image_size):
    '''Creates train and validation datasets.'''
    train_dataset = tf.keras.utils.image_dataset_from_directory(
        data_dir,
        validation_split=0.2,
        subset="training",
        seed=123,
        image_size=(image_size, image_size),
        batch_size=batch_size)
    validation_dataset = tf.keras.utils.image_dataset_from_directory(
        data_dir,
        validation_split=0.2,
        subset="validation",
        seed=123,
        image_size=(image_size, image_size),
        batch_size=batch_size)
    train_dataset = train_dataset.cache().shuffle(1000).prefetch(buffer_size=tf.data.AUTOTUNE)
    validation_dataset = validation_dataset.cache().prefetch(buffer_size=tf.data.AUTOTUNE)
    return train_dataset, validation_dataset


def create_model(image_size):
    '''Creates model.'''
    model = tf.keras.Sequential([
        tf.keras.layers.Resizing(image_size, image_size),
        tf.keras.layers.Rescaling(1./255, input_shape=(image_size, image_size, 3)),
        tf.keras.layers.Conv2D(16, 3, padding='same', activation='relu'),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, padding='same', activation='relu'),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation='relu'),
        tf.keras.layers.Dense(NUM_CLASSES, activation='softmax')
    ])
    return model


def _is_chief(task_type, task_id):
    '''Helper function. Determines if machine is chief.'''
    return task_type == 'chief'


def _get_temp_dir(dirpath, task_id):
    '''Helper function. Gets temporary directory for saving model.'''
    base_dirpath = 'workertemp_' + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    '''Helper function. Gets filepath to save model.'''
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--output-dir', required=True)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--image-size', type=int, default=32)
    args = parser.parse_args()
    save_model_dir = os.path.join(args.output_dir, 'multi-machine-output')

    # Create distribution strategy
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    # Get data
    GLOBAL_BATCH_SIZE = BATCH_SIZE * strategy.num_replicas_in_sync  # noqa: F841 (as in the codelab)
    train_dataset, validation_dataset = create_datasets(args.data_dir, BATCH_SIZE, args.image_size)

    # Wrap variable creation within strategy scope
    with strategy.scope():
        model = create_model(args.image_size)
        model.compile(optimizer=tf.keras.optimizers.Adam(),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(),
                      metrics=['accuracy'])

    model.fit(
        train_dataset,
        validation_data=validation_dataset,
        epochs=args.epochs
    )

    # Determine type and task of the machine from
    # the strategy cluster resolver
    task_type, task_id = (strategy.cluster_resolver.task_type,
                          strategy.cluster_resolver.task_id)

    # Based on the type and task, write to the desired model path
    write_model_path = write_filepath(save_model_dir, task_type, task_id)
    model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))


if __name__ == "__main__":
    main()
