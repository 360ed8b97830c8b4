"""keras-io's "Simple MNIST convnet" (examples/vision/mnist_convnet.py, Keras 3 form: ``import keras``; its
imports sorted by our lint), as a user brings it: the model, compile, ``fit(..., validation_split=0.1)`` and
``evaluate`` are the example's; only the data load differs, since nothing can be downloaded here: scikit-learn's
bundled 8x8 digits, scaled to 24x24 and padded to MNIST's 28x28 (256 of them for training, 64 for the test),
instead of ``keras.datasets.mnist.load_data()``.
"""

import keras
import numpy as np
from keras import layers

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)


def load_data():
    """The stand-in for keras.datasets.mnist.load_data(): uint8 28x28 images and their labels."""
    from sklearn.datasets import load_digits

    pixels, labels = load_digits(return_X_y=True)
    images = np.kron(pixels.reshape(-1, 8, 8), np.ones((3, 3)))  # 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))) * (255 / 16)
    images = images.astype("uint8")
    return (images[:256], labels[:256]), (images[256:320], labels[256:320])


# Load the data and split it between train and test sets
(x_train, y_train), (x_test, y_test) = load_data()

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")

# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()

batch_size = 128
epochs = 15

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
