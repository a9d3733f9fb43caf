"""Every page, fragment, stream and action of the dashboard, in one table.

Pages and fragments are GET; streams are GET under /events or ending in /events (server-sent
events); everything that changes something is POST, which fleet.web.guard lets through only
with the CSRF token.
"""

from __future__ import annotations

from starlette.routing import Route

from fleet.web.views import analytics, overview, questions, settings, task, tasks

ROUTES = [
    Route("/", overview.overview),
    Route("/events/overview", overview.events),
    Route("/events/nav", overview.nav_events),
    Route("/pause", overview.pause, methods=["POST"]),
    Route("/resume", overview.resume, methods=["POST"]),
    Route("/tasks", tasks.tasks),
    Route("/tasks", tasks.add, methods=["POST"]),
    Route("/tasks/batch", tasks.batch, methods=["POST"]),
    Route("/tasks/bulk", tasks.bulk, methods=["POST"]),
    Route("/tasks/{task_id}", task.task_page),
    Route("/tasks/{task_id}/events", task.transcript_events),
    Route("/tasks/{task_id}/panel/events", task.panel_events),
    Route("/tasks/{task_id}/lineage", task.lineage),
    Route("/tasks/{task_id}/history", task.history),
    Route("/tasks/{task_id}/diff", task.diff),
    Route("/tasks/{task_id}/kill", task.kill, methods=["POST"]),
    Route("/tasks/{task_id}/retry", task.retry, methods=["POST"]),
    Route("/tasks/{task_id}/cancel", task.cancel, methods=["POST"]),
    Route("/tasks/{task_id}/suspend", task.suspend, methods=["POST"]),
    Route("/tasks/{task_id}/resume", task.resume, methods=["POST"]),
    Route("/tasks/{task_id}/handoff", task.handoff, methods=["POST"]),
    Route("/tasks/{task_id}/merge", task.merge, methods=["POST"]),
    Route("/tasks/{task_id}/edit", task.edit, methods=["POST"]),
    Route("/questions", questions.questions_page),
    Route("/events/questions", questions.events),
    Route("/questions/{qid}/answer", questions.answer, methods=["POST"]),
    Route("/analytics", analytics.analytics),
    Route("/config", settings.settings_page),
    Route("/config/{key}", settings.set_key, methods=["POST"]),
]
