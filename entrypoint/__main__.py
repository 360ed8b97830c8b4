"""``python -m entrypoint``."""

from entrypoint.cli import main
from entrypoint.shutdown import end

end(main())
