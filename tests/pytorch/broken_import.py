"""A hooks module that cannot be imported (a dependency missing from the image): a crash loop before step 1."""

import a_package_missing_from_the_image  # noqa: F401


def build_model():  # never reached
    raise AssertionError
