"""``python -m entrypoint``."""

from entrypoint.cli import main
from entrypoint.lifecycle.shutdown import end

end(main())
