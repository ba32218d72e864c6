-- Version 016 is taken by another change in progress (issue 40); this file
-- keeps the versions without a gap until that change replaces it.
SELECT 1;
